"""Find forbidden calls in a submission's source, without running it.

The worker refuses a forbidden function when it is called (a
``TorchFunctionMode``). This scan reads the syntax tree in the grader and
finds the calls the run may not reach: a branch the checks' inputs never
take, a helper the exercise calls. Names are resolved through the file's
imports (``import torch.nn.functional as F`` makes ``F.softmax`` the
forbidden ``torch.nn.functional.softmax``); a method call ``x.softmax(...)``
on anything that is not a module is ``torch.Tensor.softmax``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable


def forbidden_calls(tree: ast.Module, exercise: str, forbidden: Iterable[str]) -> list[tuple[int, str]]:
    """``[(line, dotted name)]`` of the forbidden calls the exercise's code makes.

    Args:
        tree: the whole submission.
        exercise: the function or class the exercise asks for; its body and
            the bodies of the file's functions and classes it uses (directly
            or not) are scanned.
        forbidden: dotted names, as the catalog lists them.
    """
    forbidden = set(forbidden)
    if not forbidden:
        return []
    definitions = {node.name: node for node in tree.body
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    if exercise not in definitions:
        return []
    aliases = _aliases(tree)
    methods = {name.rpartition(".")[2]: name for name in forbidden if name.startswith("torch.Tensor.")}
    found, seen, todo = [], set(), [exercise]
    while todo:
        name = todo.pop()
        if name in seen or name not in definitions:
            continue
        seen.add(name)
        node = definitions[name]
        local = {**aliases, **_aliases(node)}
        for item in ast.walk(node):
            if isinstance(item, ast.Name) and item.id in definitions and item.id not in local:
                todo.append(item.id)  # a helper of the file: scanned too
            if not isinstance(item, (ast.Call, ast.Attribute, ast.Name)):
                continue
            target = item.func if isinstance(item, ast.Call) else item
            dotted = _dotted(target, local)
            if dotted in forbidden:
                found.append((item.lineno, dotted))
            elif (isinstance(item, ast.Call) and isinstance(target, ast.Attribute)
                  and target.attr in methods and dotted is None):
                found.append((item.lineno, methods[target.attr]))
    return sorted(set(found))


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
