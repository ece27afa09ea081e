"""How the static scan (``grader.static_scan``) reads a name in a syntax
tree: what the file's names resolve to (its imports and simple
assignments), a dotted chain such as ``F.softmax`` as ``torch.nn.functional.softmax``,
a string that is computed from literals, and which code never runs.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator

LITERAL_DEPTH = 64  # deeper string arithmetic counts as computed


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk(node)`` without the code that never runs when the grader
    imports a file: the body of ``if __name__ == "__main__":`` (the module
    has its own name there) and of ``if TYPE_CHECKING:``. Their ``else``
    runs, and is walked."""
    todo = deque([node])
    while todo:
        node = todo.popleft()
        if isinstance(node, ast.If) and never_runs(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
        yield node


def never_runs(test: ast.AST) -> bool:
    """Is ``test`` false whenever the grader runs the file:
    ``__name__ == "__main__"`` (either way round), ``TYPE_CHECKING``,
    ``typing.TYPE_CHECKING``?"""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides)
            and any(isinstance(side, ast.Constant) and side.value == "__main__" for side in sides))


def aliases_of(tree: ast.AST) -> dict[str, str]:
    """What the file's names resolve to, anywhere in it: the imports
    (``{"F": "torch.nn.functional"}``), then simple assignments of what
    resolves (``T = torch``, ``a, b = torch, np``, ``sm = torch.softmax``).
    A name bound to several things resolves to the first that resolves."""
    names, assigned = {}, []
    for item in walk(tree):
        if isinstance(item, ast.Import):
            for alias in item.names:
                first = alias.name.partition(".")[0]
                names.setdefault(alias.asname or first, alias.name if alias.asname else first)
        elif isinstance(item, ast.ImportFrom) and item.module and not item.level:
            for alias in item.names:
                if alias.name != "*":
                    names.setdefault(alias.asname or alias.name, f"{item.module}.{alias.name}")
        elif isinstance(item, ast.Assign):
            for target in item.targets:
                assigned += _bindings(target, item.value)
        elif isinstance(item, (ast.AnnAssign, ast.NamedExpr)) and item.value is not None:
            assigned += _bindings(item.target, item.value)
    # An alias of an alias resolves once its source has: each waits on the
    # name its chain starts at, and is resolved once, in time linear overall.
    waiting: dict[str, list[tuple[str, ast.AST]]] = {}
    for name, value in assigned:
        start = _chain_start(value, names)
        if start is not None:
            waiting.setdefault(start, []).append((name, value))
    todo = list(names)
    while todo:
        for name, value in waiting.pop(todo.pop(), []):
            dotted = dotted_name(value, names)
            if name not in names and dotted is not None:
                names[name] = dotted
                todo.append(name)
    return names


def _chain_start(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The name a chain starts at: ``torch`` for ``torch.nn.functional``."""
    while link_below(node, aliases) is not None:
        node = link_below(node, aliases)
    return node.id if isinstance(node, ast.Name) else None


def _bindings(target: ast.AST, value: ast.AST) -> list[tuple[str, ast.AST]]:
    """``[(name, value)]`` a simple assignment binds: ``T = torch``, and
    ``a, b = torch, np`` pair by pair (nested tuples too, without recursing)."""
    pairs, todo = [], [(target, value)]
    while todo:
        target, value = todo.pop()
        if isinstance(target, ast.Name):
            pairs.append((target.id, value))
        elif (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))
                and len(target.elts) == len(value.elts)
                and not any(isinstance(node, ast.Starred) for node in target.elts + value.elts)):
            todo += zip(target.elts, value.elts)
    return pairs


def dotted_name(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``F.softmax`` -> ``torch.nn.functional.softmax`` when ``F`` is an
    imported module (``getattr(F, "softmax")`` too); None for anything not
    reached through an import. Iterative: chains may be long."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif is_literal_getattr(node, aliases):
            parts.append(literal_string(node.args[1]))
            node = node.args[0]
        elif isinstance(node, ast.Name) and node.id in aliases:
            return ".".join([aliases[node.id], *reversed(parts)])
        else:
            return None


def is_literal_getattr(node: ast.AST, aliases: dict[str, str]) -> bool:
    """``getattr(x, "name")`` (or with a default), the name known in the source."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and "getattr" not in aliases and len(node.args) in (2, 3)
            and not any(isinstance(arg, ast.Starred) for arg in node.args)
            and literal_string(node.args[1]) is not None)


def literal_string(node: ast.AST, depth: int = 0) -> str | None:
    """The string ``node`` always is: ``"_C"``, ``"_" + "C"``, ``f"{'_'}C"``,
    ``"".join(["_", "C"])``; None when it is computed at run time."""
    if depth > LITERAL_DEPTH:
        return None
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    parts = None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        parts = [node.left, node.right]
    elif isinstance(node, ast.JoinedStr):
        parts = [value.value if isinstance(value, ast.FormattedValue) and not value.format_spec
                 and value.conversion == -1 else value for value in node.values]
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
          and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], (ast.List, ast.Tuple))):
        separator = literal_string(node.func.value, depth + 1)
        pieces = [literal_string(piece, depth + 1) for piece in node.args[0].elts]
        return None if separator is None or None in pieces else separator.join(pieces)
    if parts is None:
        return None
    pieces = [literal_string(part, depth + 1) for part in parts]
    return None if None in pieces else "".join(pieces)


def link_below(node: ast.AST, aliases: dict[str, str]) -> ast.AST | None:
    """The next link down a chain: ``x`` for ``x.attr`` and ``getattr(x, "attr")``."""
    if isinstance(node, ast.Attribute):
        return node.value
    if is_literal_getattr(node, aliases):
        return node.args[0]
    return None
