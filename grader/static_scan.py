"""Refuse, without running it, the code an exercise may not contain.

The worker refuses a forbidden function when it is called (a
``TorchFunctionMode``, and a ``TorchDispatchMode`` for the kernels below).
This scan reads the syntax tree in the grader and looks for two things:

* The exercise's forbidden names, also on the paths the checks' inputs never
  take. A forbidden entry names a family: ``torch.nn.MultiheadAttention``
  also forbids ``torch.nn.MultiheadAttention.forward``, and ``torch`` (a
  NumPy exercise) every ``torch.*`` name. They are looked for in the
  exercise's own code: its definition and the file's helpers it uses.
* Escape hatches: the ways around the worker's guards and out of the
  exercise (torch's internals and private names, ``sys.modules``,
  ``importlib``, ``exec``, frames, the interpreter's dunders, modules such
  as ``os`` or ``threading``). No exercise needs one, so every exercise
  refuses them: in its own code and in the code that runs when the file is
  imported (top-level statements, decorators, class bodies, and the helpers
  those use), which runs before every exercise.

Names are judged, not imports: ``import torch.nn.functional as F``,
``T = torch`` and ``m = torch.nn.functional`` all make the name resolve like
the module, so ``T.softmax`` is ``torch.softmax`` and ``T._C`` is
``torch._C``. ``getattr(torch, "_" + "C")`` is read as ``torch._C``; a
``getattr`` on a module whose name is computed is refused, since nothing
can tell what it reaches.

Every walk here is iterative or bounded: a submission deep enough to make a
recursive walk raise ``RecursionError`` must not crash the grader.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from grader.catalog import WHOLE_LIBRARY
from grader.name_resolution import (
    aliases_of,
    as_written,
    attribute_as_written,
    dotted_name,
    is_literal_getattr,
    link_below,
    literal_string,
)

# Ways around the worker's guards: turning off or popping its torch-function
# and dispatch modes, registering kernels, or calling ATen kernels by name.
INTERNALS = ("torch._C", "torch.ops", "torch.overrides", "torch.library", "torch.utils._python_dispatch")

# Dotted names refused with everything below them (``sys.modules[...]``).
REFUSED_NAMES = INTERNALS + (
    # The interpreter's own tables, hooks and frames.
    "sys.modules", "sys.meta_path", "sys.path_hooks", "sys.path_importer_cache",
    "sys.settrace", "sys.setprofile", "sys.gettrace", "sys.getprofile", "sys.monitoring",
    "sys.addaudithook", "sys.exc_info", "sys.exception", "sys.last_traceback", "sys.last_exc",
    # Attribute access with a name made at run time.
    "operator.attrgetter", "operator.methodcaller",
    # Code that runs where the guards do not: other processes and threads
    # (torch's modes belong to one thread), compiled extensions, unpickled
    # objects (torch.load can run any code a file holds).
    "torch.multiprocessing", "torch.utils.cpp_extension", "torch.jit.fork", "torch.hub",
    "torch.package", "torch.load", "torch.serialization",
)

# Modules an exercise file may not import (nor anything inside them). Honest
# attention code needs none of them: each reaches the grader, the interpreter,
# the process or other threads.
REFUSED_MODULES = frozenset({
    "grader", "__main__",  # the grader's own code: its checks, its references
    "builtins", "importlib", "pkgutil", "zipimport", "runpy", "code", "codeop",  # run code by name
    "inspect", "gc", "traceback", "pdb", "bdb",  # frames and every live object, the guards included
    "ctypes", "mmap",  # raw memory
    "pickle", "marshal", "copyreg", "shelve",  # objects and code built from bytes
    "os", "posix", "nt", "subprocess", "pty", "signal", "resource", "socket",  # the process and its limits
    "fcntl", "select", "selectors", "faulthandler",  # file descriptors: the grader's pipe among them
    "shutil", "pathlib", "io",  # files, and file descriptors such as the grader's pipe
    "threading", "_thread", "multiprocessing", "concurrent", "asyncio",  # code outside the guards
})

# Names inside a refused module that an exercise file may still use: the
# notebook's last cell, ``from grader import check``, copied into a graded
# cell (the worker does not grade again).
ALLOWED_NAMES = frozenset({"grader.check"})

# Builtins that run, import or expose code by name; refused wherever they are named.
REFUSED_BUILTINS = frozenset({
    "exec", "eval", "compile", "globals", "vars", "locals", "breakpoint",
    "__import__", "__builtins__", "__loader__", "__spec__", "importlib", "builtins",
})

# Attributes refused on anything: the interpreter's internals (a class's
# subclasses, a function's globals, a frame's callers) and torch's mode switches.
REFUSED_ATTRIBUTES = frozenset({
    "__globals__", "__builtins__", "__subclasses__", "__code__", "__closure__", "__mro__",
    "__bases__", "__base__", "__dict__", "__getattribute__", "__getattr__", "__self__", "__func__",
    "__loader__", "__spec__", "__reduce__", "__reduce_ex__", "__wrapped__", "__traceback__",
    "__import__",
    "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "tb_next",
    "gi_frame", "cr_frame", "ag_frame",
    "DisableTorchFunction", "DisableTorchFunctionSubclass", "TorchFunctionMode", "TorchDispatchMode",
})
# Of those, the ones an object may use on itself: ``self.__dict__.update(...)``,
# ``super().__getattr__(name)`` in a module that overrides it.
OWN_ATTRIBUTES = frozenset({"__dict__", "__getattr__"})

# The builtins that reach an attribute by a name given as a string.
ATTRIBUTE_BUILTINS = frozenset({"getattr", "setattr", "delattr", "hasattr"})

_OWN_OBJECTS = frozenset({"self", "cls"})
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class Scan:
    """One submission's syntax tree, read for every exercise of its chapter:
    what is shared between exercises (the names' meanings, the code that
    runs at import, each definition's escape hatches) is worked out once."""

    def __init__(self, tree: ast.Module):
        self.definitions = {node.name: node for node in tree.body
                            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        self.scope = _Scope.of(tree)
        self._tree = tree
        self._shared: set[tuple[int, str]] | None = None
        self._hatches: dict[int, set[tuple[int, str]]] = {}  # by id() of a node of the tree

    def findings(self, exercise: str, forbidden: Iterable[str]) -> list[tuple[int, str]]:
        """``[(line, name)]``, sorted, of what the exercise may not use: the
        forbidden names its own code reaches and the escape hatches of the
        code that runs for it. ``refusal_message`` turns one into a sentence.

        Args:
            exercise: the function or class the exercise asks for; its body
                and the bodies of the file's functions and classes it uses
                (directly or not) are scanned for both; the code that runs
                when the file is imported, for escape hatches only (they
                cost every exercise).
            forbidden: dotted names, as the catalog lists them.
        """
        own = (_reached([self.definitions[exercise]], self.definitions, self.scope)
               if exercise in self.definitions else [])
        if self._shared is None:
            self._shared = set().union(*map(self._escape_hatches, _reached(_import_time(self._tree),
                                                                           self.definitions, self.scope)))
        found = set(self._shared).union(*map(self._escape_hatches, own))
        families = frozenset(forbidden)
        for node in own:
            found.update(_forbidden_names(node, self.scope, families))
        return _longest_per_line(found)

    def _escape_hatches(self, node: ast.AST) -> set[tuple[int, str]]:
        if id(node) not in self._hatches:
            self._hatches[id(node)] = set(_escape_hatches(node, self.scope))
        return self._hatches[id(node)]


def forbidden_calls(tree: ast.Module, exercise: str, forbidden: Iterable[str]) -> list[tuple[int, str]]:
    """``Scan(tree).findings(exercise, forbidden)``: for one exercise alone."""
    return Scan(tree).findings(exercise, forbidden)


def refusal_message(exercise: str, name: str, where: str, forbidden: Iterable[str] = ()) -> str:
    """The sentence a student reads for a finding of ``forbidden_calls``:
    ``where`` says where its line is (``line 12``, a notebook's cell);
    ``forbidden`` is the exercise's catalog entry, which the finding came from."""
    library = next((family for family in forbidden if family in WHOLE_LIBRARY and _in_family(name, {family})), None)
    if library is not None and not _is_escape_hatch(name):
        return f"{exercise} uses {name} ({where}): this exercise is written without {library}"
    if not _is_escape_hatch(name):
        return f"{exercise} calls {name}, which this exercise asks you to write yourself ({where})"
    if _DOTTED.fullmatch(name) and any(_is_private(part) for part in name.split(".")):
        return (f"{exercise} uses {name} ({where}): the grader refuses private names (a leading _) "
                "in exercise files, except on self and cls, since they can reach around its "
                "checks; no exercise needs them")
    return (f"{exercise} uses {name} ({where}): the grader refuses it in exercise files, since it "
            "can reach around the grader's checks; no exercise needs it")


def _is_escape_hatch(name: str) -> bool:
    """Is a finding's ``name`` an escape hatch (not a forbidden name)? A name
    that is not dotted is code as written (``getattr(torch, name)``), which
    only the escape-hatch rules report."""
    if not _DOTTED.fullmatch(name):
        return True
    if name in ALLOWED_NAMES:
        return False
    parts = name.split(".")
    return (name in REFUSED_BUILTINS or parts[0] in REFUSED_MODULES
            or any(_is_private(part) or part in REFUSED_ATTRIBUTES for part in parts)
            or any(name == refused or name.startswith(refused + ".") for refused in REFUSED_NAMES))


def _is_private(name: str) -> bool:
    """``_C``, ``_pop_mode``: a leading underscore, and not a dunder."""
    return name.startswith("_") and not (len(name) > 4 and name.startswith("__") and name.endswith("__"))


def _longest_per_line(found: set[tuple[int, str]]) -> list[tuple[int, str]]:
    """``found`` without the prefixes of a longer name on the same line:
    ``torch._C.DisableTorchFunction``, not also ``torch._C``."""
    ordered = sorted(found)
    kept = []
    for line, name in ordered:
        # The first name after ``name.`` in sorted order is the one that could extend it.
        after = bisect.bisect_left(ordered, (line, name + "."))
        if not (after < len(ordered) and ordered[after][0] == line
                and ordered[after][1].startswith(name + ".")):
            kept.append((line, name))
    return kept


# -- what the exercise's run reaches -----------------------------------------


@dataclass(frozen=True)
class _Scope:
    """What the file's names are: ``aliases`` maps a name to the dotted name
    it resolves to (``{"F": "torch.nn.functional", "T": "torch"}``);
    ``defined`` holds the functions and classes the file defines."""

    aliases: dict[str, str]
    defined: frozenset[str]
    classes: frozenset[str]

    @classmethod
    def of(cls, tree: ast.Module) -> _Scope:
        definitions = [node for node in ast.walk(tree)
                       if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        return cls(aliases_of(tree), frozenset(node.name for node in definitions),
                   frozenset(node.name for node in definitions if isinstance(node, ast.ClassDef)))

    def is_own(self, node: ast.AST) -> bool:
        """Is ``node`` an object reaching its own attributes: ``self``,
        ``cls``, ``super()``, ``type(self)`` or one of the file's classes?"""
        if isinstance(node, ast.Name):
            return node.id not in self.aliases and (node.id in _OWN_OBJECTS or node.id in self.classes)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "super":
                return True
            return (node.func.id == "type" and len(node.args) == 1 and isinstance(node.args[0], ast.Name)
                    and node.args[0].id in _OWN_OBJECTS)
        return False


def _import_time(tree: ast.Module) -> list[ast.AST]:
    """The code that runs when the file is imported, before any exercise:
    top-level statements, and of each definition its decorators, defaults
    and annotations (and a class's whole body, but not its methods' bodies)."""
    nodes, todo = [], list(tree.body)
    while todo:
        statement = todo.pop()
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nodes += statement.decorator_list + _signature(statement.args)
            nodes += [statement.returns] if statement.returns else []
        elif isinstance(statement, ast.ClassDef):
            nodes += statement.decorator_list + statement.bases + statement.keywords
            todo += statement.body
        else:
            nodes.append(statement)
    return nodes


def _signature(arguments: ast.arguments) -> list[ast.AST]:
    """The defaults and annotations of a function: evaluated at its ``def``."""
    named = arguments.posonlyargs + arguments.args + arguments.kwonlyargs
    named += [arg for arg in (arguments.vararg, arguments.kwarg) if arg]
    return ([arg.annotation for arg in named if arg.annotation] + arguments.defaults
            + [default for default in arguments.kw_defaults if default])


def _reached(roots: list[ast.AST], definitions: dict[str, ast.AST], scope: _Scope) -> list[ast.AST]:
    """``roots`` and the file's functions and classes they use, directly or not."""
    seen = {name for name, node in definitions.items() if any(node is root for root in roots)}
    reached, todo = [], list(roots)
    while todo:
        node = todo.pop()
        reached.append(node)
        for item in ast.walk(node):
            if (isinstance(item, ast.Name) and item.id in definitions and item.id not in scope.aliases
                    and item.id not in seen):
                seen.add(item.id)
                todo.append(definitions[item.id])
    return reached


# -- name chains -----------------------------------------------------------------


@dataclass(frozen=True)
class _Chains:
    """The name chains of one piece of code (``torch.nn.functional.softmax``,
    ``getattr(torch, "_C").DisableTorchFunction``), each link a node.

    Only the outermost link of a chain is judged by its dotted name: a
    shorter one is a prefix of it, and resolving every link of a long chain
    would cost its length squared.
    """

    inner: frozenset[int]  # ids of the links inside a longer chain
    resolving: frozenset[int]  # ids of the links of chains that start at an import

    @classmethod
    def of(cls, node: ast.AST, aliases: dict[str, str]) -> _Chains:
        below = {}  # id of a link -> the next link down
        for item in ast.walk(node):
            link = link_below(item, aliases)
            if link is not None:
                below[id(item)] = link
        inner = {id(link) for link in below.values()}
        resolving = set()
        for item in ast.walk(node):
            if id(item) in inner or not (id(item) in below or isinstance(item, ast.Name)):
                continue
            chain = [item]
            while id(chain[-1]) in below:
                chain.append(below[id(chain[-1])])
            if isinstance(chain[-1], ast.Name) and chain[-1].id in aliases:
                resolving.update(id(link) for link in chain)
        return cls(frozenset(inner), frozenset(resolving))

    def outermost(self, node: ast.AST) -> bool:
        """Is ``node`` the whole of a chain that starts at an import?"""
        return id(node) in self.resolving and id(node) not in self.inner


# -- escape hatches ------------------------------------------------------------


def _escape_hatches(node: ast.AST, scope: _Scope) -> Iterator[tuple[int, str]]:
    """The escape hatches in ``node``, as ``(line, name)``."""
    chains = _Chains.of(node, scope.aliases)
    called = {id(item.func) for item in ast.walk(node) if isinstance(item, ast.Call)}
    for item in ast.walk(node):
        if isinstance(item, (ast.Import, ast.ImportFrom)):
            yield from ((item.lineno, name) for name in _imported(item) if _is_escape_hatch(name))
        elif chains.outermost(item):
            dotted = dotted_name(item, scope.aliases)
            if _is_escape_hatch(dotted):
                yield item.lineno, dotted
        elif isinstance(item, ast.Name) and isinstance(item.ctx, ast.Load):
            yield from _refused_name(item, scope, id(item) in called)
        if isinstance(item, ast.Attribute) and id(item) not in chains.resolving:
            yield from _refused_attribute(item.value, item.attr, item.lineno, scope)
        elif isinstance(item, ast.Call):
            yield from _refused_lookup(item, scope, chains)


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import binds: ``torch._C`` for ``from torch import
    _C``, the module itself for ``from os import *``. Relative imports find
    nothing in a single file; they fail on their own."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level or not node.module:
        return []
    return [node.module if alias.name == "*" else f"{node.module}.{alias.name}" for alias in node.names]


def _refused_name(node: ast.Name, scope: _Scope, called: bool) -> Iterator[tuple[int, str]]:
    """``exec``, ``globals``, a ``getattr`` passed around (whose calls this
    scan could not follow). Names bound by imports are judged as chains."""
    if node.id in scope.aliases or node.id in scope.defined:
        return
    if node.id in REFUSED_BUILTINS:
        yield node.lineno, node.id
    elif node.id in ATTRIBUTE_BUILTINS and not called:
        yield node.lineno, f"{node.id} as a value"


def _refused_attribute(base: ast.AST, attr: str, line: int, scope: _Scope) -> Iterator[tuple[int, str]]:
    """``base.attr`` (or ``getattr(base, "attr")``), ``base`` not reached
    through an import: a private name outside ``self``, the interpreter's
    dunders, frames, torch's mode switches."""
    if _is_private(attr) and not scope.is_own(base):
        yield line, attribute_as_written(base, attr)
    elif attr in REFUSED_ATTRIBUTES and not (attr in OWN_ATTRIBUTES and scope.is_own(base)):
        yield line, attribute_as_written(base, attr)


def _refused_lookup(call: ast.Call, scope: _Scope, chains: _Chains) -> Iterator[tuple[int, str]]:
    """``getattr(x, "_C")`` is ``x._C``; ``getattr(torch, name)``, a name
    computed at run time on a module, could be anything."""
    function = call.func
    if not (isinstance(function, ast.Name) and function.id in ATTRIBUTE_BUILTINS
            and function.id not in scope.aliases and function.id not in scope.defined):
        return
    if len(call.args) < 2 or any(isinstance(arg, ast.Starred) for arg in call.args[:2]):
        yield call.lineno, as_written(call) or f"{function.id}(*...)"
        return
    target, name = call.args[0], literal_string(call.args[1])
    if name is not None:
        if function.id != "hasattr" and id(call) not in chains.resolving:  # asking is harmless
            yield from _refused_attribute(target, name, call.lineno, scope)
    elif id(target) in chains.resolving:
        yield call.lineno, as_written(call) or f"{function.id}({dotted_name(target, scope.aliases)}, ...)"


# -- forbidden names -----------------------------------------------------------


def _forbidden_names(node: ast.AST, scope: _Scope, forbidden: frozenset[str]) -> Iterator[tuple[int, str]]:
    """The names of the ``forbidden`` families ``node`` reaches. A method of
    something that is not a module, ``x.softmax``, is ``torch.Tensor.softmax``
    when that is forbidden."""
    methods = {name.rpartition(".")[2]: name for name in forbidden if name.startswith("torch.Tensor.")}
    chains = _Chains.of(node, scope.aliases)
    for item in ast.walk(node):
        if isinstance(item, (ast.Name, ast.Attribute)) and not isinstance(item.ctx, ast.Load):
            continue  # binding or patching a name is not using it
        if chains.outermost(item):
            dotted = dotted_name(item, scope.aliases)
            if _in_family(dotted, forbidden):
                yield item.lineno, dotted
        elif id(item) not in chains.resolving:
            pair = _attribute_pair(item, scope)
            if pair is not None and pair[1] in methods and not scope.is_own(pair[0]):
                yield item.lineno, methods[pair[1]]


def _in_family(dotted: str, families: frozenset[str]) -> bool:
    """Is ``dotted`` one of ``families`` or below one of them?"""
    return any(dotted == family or dotted.startswith(family + ".") for family in families)


def _attribute_pair(node: ast.AST, scope: _Scope) -> tuple[ast.AST, str] | None:
    """``(x, "softmax")`` for ``x.softmax`` and ``getattr(x, "softmax")``."""
    if isinstance(node, ast.Attribute):
        return node.value, node.attr
    if is_literal_getattr(node, scope.aliases):
        return node.args[0], literal_string(node.args[1])
    return None
