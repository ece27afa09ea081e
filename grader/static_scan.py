"""Find forbidden calls in a submission's source, without running it.

The worker refuses a forbidden function when it is called (a
``TorchFunctionMode``). This scan reads the syntax tree in the grader and
finds the calls the run may not reach: a branch the checks' inputs never
take, a helper the exercise calls. Names are resolved through the file's
imports (``import torch.nn.functional as F`` makes ``F.softmax`` the
forbidden ``torch.nn.functional.softmax``); a method call ``x.softmax(...)``
on anything that is not a module is ``torch.Tensor.softmax``.

The same walk finds references to torch's internals (``torch._C``,
``torch.ops``, the mode stacks): the ways around the worker's run-time
guards. An attention exercise never needs them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

# Ways around the worker's guards: turning off or popping its torch-function
# and dispatch modes, or calling ATen kernels by name.
INTERNALS = ("torch._C", "torch.ops", "torch.overrides", "torch.utils._python_dispatch")


def forbidden_calls(tree: ast.Module, exercise: str, forbidden: Iterable[str]) -> list[tuple[int, str]]:
    """``[(line, dotted name)]`` of the forbidden calls the exercise's code
    makes, and of its references to torch's internals (``INTERNALS``).

    Args:
        tree: the whole submission.
        exercise: the function or class the exercise asks for; its body, the
            bodies of the file's functions and classes it uses (directly or
            not) and the file's top-level statements (they run before every
            exercise) are scanned.
        forbidden: dotted names, as the catalog lists them.
    """
    forbidden = set(forbidden)
    definitions = {node.name: node for node in tree.body
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    if exercise not in definitions:
        return []
    aliases = _aliases(tree)
    methods = {name.rpartition(".")[2]: name for name in forbidden if name.startswith("torch.Tensor.")}
    top_level = [node for node in tree.body if node not in definitions.values()]
    found, seen, todo = [], set(), [exercise]
    for node in top_level:
        for item in ast.walk(node):
            if isinstance(item, ast.Name) and item.id in definitions:
                todo.append(item.id)  # called at import: scanned too
    while todo:
        name = todo.pop()
        if name in seen or name not in definitions:
            continue
        seen.add(name)
        found += _scan(definitions[name], {**aliases, **_aliases(definitions[name])}, forbidden, methods,
                       definitions, todo)
    for node in top_level:
        found += _scan(node, aliases, forbidden, methods, definitions, [])
    # torch._C.DisableTorchFunction, not also its prefix torch._C on that line
    return sorted({(line, name) for line, name in found
                   if not any(other.startswith(name + ".") for at, other in found if at == line)})


def _scan(node: ast.AST, local: dict[str, str], forbidden: set[str], methods: dict[str, str],
          definitions: dict[str, ast.AST], todo: list[str]) -> list[tuple[int, str]]:
    """The forbidden names and internals ``node`` reaches; the file's own
    functions it names are added to ``todo``."""
    found = []
    for item in ast.walk(node):
        if isinstance(item, ast.Name) and item.id in definitions and item.id not in local:
            todo.append(item.id)  # a helper of the file: scanned too
        if not isinstance(item, (ast.Call, ast.Attribute, ast.Name)):
            continue
        target = item.func if isinstance(item, ast.Call) else item
        dotted = _dotted(target, local)
        if dotted in forbidden or (dotted and is_internal(dotted) and not isinstance(item, ast.Call)):
            found.append((item.lineno, dotted))
        elif (isinstance(item, ast.Call) and isinstance(target, ast.Attribute)
              and target.attr in methods and dotted is None):
            found.append((item.lineno, methods[target.attr]))
    return found


def is_internal(dotted: str) -> bool:
    """Is ``dotted`` one of torch's internals (``INTERNALS``) or inside one?"""
    return any(dotted == prefix or dotted.startswith(prefix + ".") for prefix in INTERNALS)


def _aliases(node: ast.AST) -> dict[str, str]:
    """What the imports in ``node`` bind: ``{"F": "torch.nn.functional"}``."""
    names = {}
    for item in ast.walk(node):
        if isinstance(item, ast.Import):
            for alias in item.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    first = alias.name.partition(".")[0]
                    names[first] = first
        elif isinstance(item, ast.ImportFrom) and item.module and not item.level:
            for alias in item.names:
                names[alias.asname or alias.name] = f"{item.module}.{alias.name}"
    return names


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``F.softmax`` -> ``torch.nn.functional.softmax`` when ``F`` is an
    imported module; None for anything not reached through an import."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None
