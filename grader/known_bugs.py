"""Realistic wrong implementations, written as edits of the reference solution.

Each known bug is a one-line change to a function in ``solutions/`` (the
line a student really gets wrong) with a hint in words. The catalog serves
twice:

* the project's tests write each buggy file and prove that the checks fail
  the exercise that holds the bug;
* while grading, when a value does not match the reference, the grader runs
  the buggy versions on the same inputs, in its own process (this is the
  course's code, not the student's), and when one gives the student's value
  the message names the likely bug. When no single bug does, two bugs of the
  same exercise made together may (``Combination``): a student who makes one
  catalogued mistake often makes another.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import types
import warnings
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from grader import edits, relations
from grader.chapters import KnownBug, read_known_bugs
from grader.compare import matches, raised_text
from grader.catalog import COURSE_ROOT, Chapter
from grader.module_calls import ModuleCall, run_module_call
from grader.recorded_values import equal
from grader.wire import MAX_TEXT
from grader.relations import Variant

class _Catalog(MutableMapping):
    """``{chapter id: its bugs}``, read from each chapter's ``bugs.py`` on first use.

    Not at import: a grading process forks the server its workers come
    from before its checks first ask for a bug, so the catalog's edited
    solution lines are never in a worker's memory (Gradescope, where
    student code could read its own memory out and print it)."""

    def __init__(self):
        self._bugs: dict[str, tuple[KnownBug, ...]] | None = None

    def _loaded(self) -> dict[str, tuple[KnownBug, ...]]:
        if self._bugs is None:
            self._bugs = read_known_bugs()
        return self._bugs

    def __getitem__(self, chapter_id: str) -> tuple[KnownBug, ...]:
        return self._loaded()[chapter_id]

    def __setitem__(self, chapter_id: str, bugs: tuple[KnownBug, ...]) -> None:
        self._loaded()[chapter_id] = bugs

    def __delitem__(self, chapter_id: str) -> None:
        del self._loaded()[chapter_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())


KNOWN_BUGS = _Catalog()
Item = TypeVar("Item")


def function_span(source: str, name: str) -> tuple[int, int]:
    """Character offsets ``[start, end)`` of a top-level function's or class's text."""
    tree = ast.parse(source)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return starts[node.lineno - 1], starts[node.end_lineno]
    raise KeyError(f"no function {name!r}")


def apply_bug(source: str, bug: KnownBug) -> str:
    """The solution's text with ``bug`` applied; ``old`` must occur exactly
    once in the function, so a changed solution breaks loudly here."""
    start, end = function_span(source, bug.exercise)
    return source[:start] + _edited(source[start:end], bug) + source[end:]


def _edited(definition: str, bug: KnownBug) -> str:
    if definition.count(bug.old) != 1:
        raise ValueError(f"{bug.exercise}/{bug.name}: {bug.old!r} occurs "
                         f"{definition.count(bug.old)} times in the solution, expected once")
    return definition.replace(bug.old, bug.new)


@dataclass(frozen=True)
class Combination:
    """Known bugs of one exercise made together, each edit applied in turn.

    A bug's hint names its mistake, so the combination's names each
    distinct mistake once: the same slip on several lines (``x @ w_q``,
    ``x @ w_k`` and ``x @ w_v``, three bugs with one hint) is one mistake.
    """

    parts: tuple[KnownBug, ...]

    @property
    def exercise(self) -> str:
        return self.parts[0].exercise

    @property
    def name(self) -> str:
        return "+".join(part.name for part in self.parts)

    @property
    def hint(self) -> str:
        hints = list(dict.fromkeys(part.hint for part in self.parts))
        if len(hints) == 1:
            return hints[0]
        mistakes = [hint.removeprefix("looks like ") for hint in hints]
        return "looks like two mistakes together: " + "; and ".join(mistakes)


def apply_bugs(source: str, bugs: Iterable[KnownBug]) -> str:
    """The solution's text with every one of ``bugs`` applied, in turn."""
    for bug in bugs:
        source = apply_bug(source, bug)
    return source


def combinations(bugs: Sequence[KnownBug], exercise: str) -> list[Combination]:
    """The combinations of ``exercise``'s bugs a grade tries when no single
    one explains an answer: every pair, and each group of three or more that
    share a hint (one slip on every line it can be made on). A bug that
    raises (``error``) is matched by its message, alone."""
    own = [bug for bug in bugs if bug.exercise == exercise and not bug.error]
    groups = [tuple(bug for bug in own if bug.hint == hint) for hint in dict.fromkeys(b.hint for b in own)]
    return ([Combination(pair) for pair in itertools.combinations(own, 2)] +
            [Combination(group) for group in groups if len(group) >= 3])


@dataclass(frozen=True)
class _Reference:
    """A chapter's solution, compiled once, and where each definition is.

    ``spans``: a top-level function or class -> ``(start, end)``, the
    character offsets of its text; ``imports``: those of the module's
    import statements; ``redefined``: an exercise -> the
    definitions to run again when it is edited, itself first, then those
    the module builds from it as it runs (a subclass), in the file's order;
    an exercise missing from it is compiled with the whole file
    (``_buggy_module``).
    """

    source: str
    code: types.CodeType
    spans: dict[str, tuple[int, int]]
    imports: tuple[tuple[int, int], ...]
    redefined: dict[str, tuple[str, ...]]


@cache
def _reference(chapter: Chapter, root: Path) -> _Reference:
    source = chapter.solution(root).read_text(encoding="utf-8")
    tree = ast.parse(source)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = {node.name: (starts[node.lineno - 1], starts[node.end_lineno])
             for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    imports = tuple((starts[node.lineno - 1], starts[node.end_lineno])
                    for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))
    reads = [(statement, {node.id for node in _run_at_definition(statement) if isinstance(node, ast.Name)})
             for statement in tree.body]
    redefined = {}
    for exercise in spans:
        names = [exercise]
        for statement, read in reads:
            if read & set(names) and getattr(statement, "name", None) not in names:
                names.append(getattr(statement, "name", None))
        # A decorator would be left out of the definition's text; a module
        # constant built from the exercise has no text of its own here.
        if None not in names and not any(node.decorator_list for node in tree.body
                                         if getattr(node, "name", None) in names):
            redefined[exercise] = tuple(sorted(names, key=lambda name: spans[name]))
    # dont_inherit: the file's own __future__ imports, not this module's, as when it is imported.
    return _Reference(source, compile(source, chapter.module, "exec", dont_inherit=True), spans, imports,
                      redefined)


def _run_at_definition(statement: ast.stmt) -> Iterator[ast.AST]:
    """The nodes of a module's statement evaluated when the module runs and
    kept in what it defines: all but the bodies of functions and lambdas,
    and annotations (stored, never called)."""
    pending: list[ast.AST] = [statement]
    while pending:
        node = pending.pop()
        skipped: list = [getattr(node, "annotation", None), getattr(node, "returns", None)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            skipped += node.body
        elif isinstance(node, ast.Lambda):
            skipped.append(node.body)
        yield node
        pending.extend(child for child in ast.iter_child_nodes(node) if not any(child is s for s in skipped))


def _buggy_module(chapter: Chapter, name: str, bugs: Sequence[KnownBug], root: Path) -> types.ModuleType:
    """The reference with ``bugs``, all of one exercise, applied.

    The whole edited solution compiled anew would cost a parse of every
    line for each bug (tens of milliseconds a chapter, hundreds of bugs and
    combinations). So the reference runs as compiled once, and only the
    exercise's edited definition (and what the module builds from it as it
    runs, a subclass) is compiled and run after it: every other function
    finds the edited one by name when called, as in the edited file.
    """
    reference, exercise = _reference(chapter, root), bugs[0].exercise
    module = types.ModuleType(name)
    if exercise not in reference.redefined:
        exec(compile(apply_bugs(reference.source, bugs), name, "exec", dont_inherit=True), module.__dict__)
        return module
    start, end = reference.spans[exercise]
    edited = reference.source[start:end]
    for bug in bugs:
        edited = _edited(edited, bug)
    # Each definition at its own lines (blank lines before it), so that a
    # traceback's line numbers are the file's; after the file's imports,
    # which compile as in the file (its __future__ imports, and the calls
    # on an imported module, which Python compiles apart).
    pieces = sorted([*reference.imports, *(reference.spans[name] for name in reference.redefined[exercise])])
    text, at = "", 0
    for first, last in pieces:
        text += "\n" * reference.source.count("\n", at, first)
        text += edited if (first, last) == (start, end) else reference.source[first:last]
        at = last
    exec(reference.code, module.__dict__)
    exec(compile(text, name, "exec", dont_inherit=True), module.__dict__)
    return module


@cache
def _reference_tree(chapter: Chapter, root: Path) -> ast.Module:
    return ast.parse(_reference(chapter, root).source)


def definitions_with(chapter: Chapter, exercise: str, definition: ast.FunctionDef | ast.ClassDef,
                     root: Path = COURSE_ROOT) -> types.CodeType:
    """The code that, run over the reference module (``edited_module``),
    puts ``definition`` (an edited syntax tree of ``exercise``) in its
    place: the file's imports, then the definition and what the module
    builds from it as it runs, as ``_buggy_module`` runs an edited text;
    the whole file where the exercise cannot be run again alone."""
    reference, tree = _reference(chapter, root), _reference_tree(chapter, root)
    again = reference.redefined.get(exercise)
    body = [definition if getattr(statement, "name", None) == exercise else statement for statement in tree.body
            if again is None or isinstance(statement, (ast.Import, ast.ImportFrom))
            or getattr(statement, "name", None) in again]
    return compile(ast.Module(body, type_ignores=[]), f"{chapter.module}__{exercise}__edit", "exec",
                   dont_inherit=True)


def edited_module(chapter: Chapter, code: types.CodeType, root: Path = COURSE_ROOT) -> types.ModuleType:
    """The reference with an edit's ``code`` (``definitions_with``) run over it."""
    module = types.ModuleType(code.co_filename)
    exec(_reference(chapter, root).code, module.__dict__)
    exec(code, module.__dict__)
    return module


@cache
def _edited_modules(chapter: Chapter, exercise: str,
                    root: Path = COURSE_ROOT) -> tuple[tuple[edits.Edit, types.ModuleType], ...]:
    """Each of ``edits.edits`` of the exercise as a module; built on the
    first answer nothing else explains."""
    modules = []
    for edit in edits.edits(chapter, exercise, root):
        with edit.made() as definition:
            try:
                code = definitions_with(chapter, exercise, definition, root)
            except (SyntaxError, ValueError, TypeError):  # an edit Python does not compile
                continue
        modules.append((edit, edited_module(chapter, code, root)))
    return tuple(modules)


@cache
def _reference_module(chapter: Chapter, root: Path = COURSE_ROOT) -> types.ModuleType:
    """The reference solution itself, run as the bugs' modules are."""
    module = types.ModuleType(f"{chapter.module}__reference")
    exec(_reference(chapter, root).code, module.__dict__)
    return module


@cache
def buggy_modules(chapter: Chapter, root: Path = COURSE_ROOT) -> tuple[tuple[KnownBug, object], ...]:
    """Each known bug of ``chapter`` as a module built from the mutated solution."""
    return tuple((bug, _buggy_module(chapter, f"{chapter.module}__{bug.exercise}__{bug.name}", [bug], root))
                 for bug in KNOWN_BUGS.get(chapter.id, ()))


@cache
def combined_modules(chapter: Chapter, exercise: str,
                     root: Path = COURSE_ROOT) -> tuple[tuple[Combination, object], ...]:
    """Each ``combinations`` of ``exercise``'s bugs as a module; built on the
    first answer no single bug explains."""
    modules = []
    for combination in combinations(KNOWN_BUGS.get(chapter.id, ()), exercise):
        name = f"{chapter.module}__{exercise}__{combination.name}"
        try:
            modules.append((combination, _buggy_module(chapter, name, combination.parts, root)))
        except ValueError:  # two edits of one line: no student makes both
            continue
    return tuple(modules)


def seen_first(bugs: Iterable[Item], hint_of: Callable[[Item], str], seen: Sequence[str]) -> list[Item]:
    """``bugs`` with those whose hint an earlier check of the run matched
    first, each group in its own order. A student's slip shows in check after
    check: trying the bug already found first saves running every other one
    in each of those checks. The first match, and so the
    hint, is what the plain order gives whenever only one bug matches."""
    return sorted(bugs, key=lambda bug: hint_of(bug) not in seen)


class Lookalikes:
    """The outputs of every known bug for one call, computed on demand.

    ``part(i)`` selects item ``i`` of tuple outputs; the result is what
    ``compare.expect_close`` takes as ``bugs``. ``seen``: the hints earlier
    checks of this run matched (``seen_first``); it may grow meanwhile.
    """

    def __init__(self, chapter: Chapter, function: str, args: tuple, kwargs: dict,
                 exercise: str | None = None, module: ModuleCall | None = None,
                 seen: Sequence[str] = ()):
        self.chapter, self.function = chapter, function
        self.args, self.kwargs = args, kwargs
        # A module handed to a function (generate(model, ...)) is that function's call.
        self.exercise = exercise or (module.passed_to if module is not None and module.passed_to else function)
        self.module = module
        self.seen = seen
        self.edits_raised: list[tuple[edits.Edit, str]] = []  # what edits raised, as ``outputs_by_bug`` ran them

    def __call__(self) -> Iterator[tuple[str, object]]:
        return ((bug.hint, output) for bug, output in self.outputs_by_bug(self.seen))

    def part(self, index: int, answer: object = None):
        """Lookalikes of item ``index`` of a tuple output; given the whole
        ``answer``, only of the bugs whose other items match it too
        (``explaining_the_rest``)."""
        return lambda: explaining_the_rest(self(), index, answer)

    def outputs_by_bug(self, seen: Sequence[str] = ()
                       ) -> Iterator[tuple[KnownBug | Combination | Variant | edits.Edit, object]]:
        """Each bug that runs on these inputs, with its whole output, then each
        combination of the exercise's bugs, then each ``relations.Variant``
        of the call, then each of ``edits.edits``; with no ``seen``, in the order
        ``grader.recorded`` keeps for the student edition. A generator: the
        combinations are built and run only when no single bug matched."""
        # The exercise's own bugs first: they are the likelier explanation.
        ordered = sorted(buggy_modules(self.chapter), key=lambda pair: pair[0].exercise != self.exercise)
        own: dict[KnownBug, object] = {}
        for bug, module in seen_first(ordered, lambda pair: pair[0].hint, seen):
            output = self._run(module)
            if output is not _FAILED:
                if bug.exercise == self.exercise:
                    own[bug] = output
                yield bug, output
        # A bug that changes nothing on these inputs (a mask's bug, no mask
        # given) adds nothing to another: its combinations are that other bug.
        right = self._run(_reference_module(self.chapter))
        unchanged = {bug for bug, output in own.items() if right is not _FAILED and _same(output, right)}
        for combination, module in seen_first(combined_modules(self.chapter, self.exercise),
                                              lambda pair: pair[0].hint, seen):
            if unchanged.isdisjoint(combination.parts):
                output = self._run(module)
                if output is not _FAILED:
                    yield combination, output
        # Last, mistakes of what goes in (``relations.variants``): the reference on changed inputs.
        reference = _reference_module(self.chapter)
        for variant in relations.variants(self.args, self.kwargs, self._parameter_names(reference)):
            output = self._run(reference, variant.args, variant.kwargs)
            if output is not _FAILED and (right is _FAILED or not _same(output, right)):
                yield variant, output
        # Then one slip anywhere in the exercise's definition (``grader.edits``).
        if relations.ENABLED and right is not _FAILED:
            wanted = relations.edits_to_try(seen)
            for edit, module in _edited_modules(self.chapter, self.exercise):
                if not wanted(edit.hint):
                    continue
                try:
                    output = self._call(module)
                except Exception as error:  # noqa: BLE001 - kept for an answer that raises (``edits_raised``)
                    self.edits_raised.append((edit, _said(error)))
                    continue
                if _alike(output, right) and not _same(output, right):
                    yield edit, output

    def raised_by_edits(self) -> list[tuple[edits.Edit, str]]:
        """Each of ``edits.edits`` of the exercise that raises on these
        inputs, where the reference does not, with what it raised
        (``compare.raised_text``); those ``seen`` leaves (``relations.Seen``) only."""
        if not relations.ENABLED or self._run(_reference_module(self.chapter)) is _FAILED:
            return []
        wanted = relations.edits_to_try(self.seen)
        raised = []
        for edit, module in _edited_modules(self.chapter, self.exercise):
            if wanted(edit.hint):
                error = self._raised(module)
                if error is not None:
                    raised.append((edit, error))
        return raised

    def _parameter_names(self, reference: types.ModuleType) -> list[str]:
        """The names of the call's positional parameters, as the reference
        defines them (a method's and a function handed the module, without
        their first)."""
        try:
            if self.module is None:
                function, skip = getattr(reference, self.function), 0
            elif self.module.passed_to:
                function, skip = getattr(reference, self.module.passed_to), 1
            else:
                function, skip = getattr(getattr(reference, self.function), self.module.method or "forward"), 1
            return list(inspect.signature(function).parameters)[skip:]
        except (AttributeError, TypeError, ValueError):
            return []

    def _run(self, module: types.ModuleType, args: tuple | None = None, kwargs: dict | None = None) -> object:
        """This call (or the call with ``args`` and ``kwargs``) on ``module``'s
        function or class; ``_FAILED`` if it raises, as a bug that cannot run
        on these inputs explains nothing."""
        try:
            return self._call(module, args, kwargs)
        except Exception:
            return _FAILED

    def _raised(self, module: types.ModuleType) -> str | None:
        """What this call on ``module`` raises (``compare.raised_text``), None if it returns."""
        try:
            self._call(module)
        except Exception as error:  # noqa: BLE001 - what it raised is the answer here
            return _said(error)
        return None

    def _call(self, module: types.ModuleType, args: tuple | None = None, kwargs: dict | None = None) -> object:
        args = _cloned(self.args if args is None else args)
        kwargs = _cloned(self.kwargs if kwargs is None else kwargs)
        # A wrong function may divide by zero: its NumPy warnings say nothing to anyone here.
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            if self.module is None:
                return getattr(module, self.function)(*args, **kwargs)
            return run_module_call(module, self.function, self.module, args, kwargs)


_FAILED = object()


def _said(error: Exception) -> str:
    """What ``error`` says, as a worker reports a student's (``compare.raised_text``)."""
    return raised_text(type(error).__name__, str(error)[:MAX_TEXT])


def explaining_the_rest(pairs: Iterable[tuple[str, object]], index: int,
                        answer: object = None) -> Iterator[tuple[str, object]]:
    """``(hint, item index of the output)`` of each ``(hint, output)``; where
    the whole ``answer`` is given, only of those outputs whose other items
    it matches too. A bug that gives one item of an answer and not the
    others does not explain that answer: a student's weights can be a known
    bug's while the output is right (or wrong in another way)."""
    for hint, output in pairs:
        try:
            item = output[index]
            if answer is not None and not (len(answer) == len(output) and all(
                    matches(answer[other], output[other]) for other in range(len(output)) if other != index)):
                continue
        except Exception:  # an output without that item (or of another kind) explains nothing
            continue
        yield hint, item


def _alike(output: object, right: object) -> bool:
    """Whether ``output`` is of the kind of the right answer, item by item
    (an edit that returns the module itself, or a list for a tensor,
    explains no answer a check compares)."""
    if isinstance(right, (tuple, list)):
        return isinstance(output, (tuple, list)) and len(output) == len(right) and \
            all(_alike(one, other) for one, other in zip(output, right))
    return type(output) is type(right)


def _same(a: object, b: object) -> bool:
    try:
        return equal(a, b)
    except Exception:  # values of no kind it compares: not known to be the same
        return False


def _cloned(values):
    if isinstance(values, dict):
        return {key: _cloned(value) for key, value in values.items()}
    if isinstance(values, (tuple, list)):
        return type(values)(_cloned(value) for value in values)
    if isinstance(values, torch.Tensor):
        return values.detach().clone()
    return values.copy() if hasattr(values, "copy") else values


class LiveBugs:
    """The ``bugs`` fixture in the instructor's tree (``recorded.Live``; an
    edition's are ``RecordingBugs`` and ``ReplayBugs``), which runs the known
    bugs: ``bugs.softmax(x, dim=0)`` gives its Lookalikes,
    and ``bugs.module("MultiHeadAttention", recipe, x)`` those of a class.
    ``seen``: the hints earlier checks of the run matched (``seen_first``)."""

    def __init__(self, chapter: Chapter, seen: Sequence[str] = ()):
        self.chapter = chapter
        self.seen = seen

    def module(self, name: str, recipe: ModuleCall, *args, **kwargs) -> Lookalikes:
        return Lookalikes(self.chapter, name, args, kwargs, module=recipe, seen=self.seen)

    def __getattr__(self, function: str):
        if function.startswith("_"):
            raise AttributeError(function)
        return lambda *args, **kwargs: Lookalikes(self.chapter, function, args, kwargs, seen=self.seen)
