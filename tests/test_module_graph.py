"""grader/ as an import graph: no module imports, however indirectly and
wherever in its code, a module that imports it back."""

import ast
from pathlib import Path

from grader.catalog import COURSE_ROOT

GRADER = COURSE_ROOT / "grader"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(folder: Path = GRADER) -> dict[str, set[str]]:
    """``{module: the modules of the package it imports}``, at its top and
    inside its functions alike (a lazy import is an edge too)."""
    modules = {_module_name(path, folder.parent): path for path in folder.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = {module for module in found if module in modules and module != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected parts of more than one module."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            part = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(part) > 1:
                found.append(sorted(part))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_no_module_of_the_grader_imports_one_that_imports_it_back():
    assert circles(import_graph()) == []


def test_a_circle_is_found_where_there_is_one(tmp_path):
    """The search is not vacuous: two modules that import each other."""
    package = tmp_path / "grader"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "one.py").write_text("def f():\n    from grader import two\n")
    (package / "two.py").write_text("from grader.one import f\n")
    assert circles(import_graph(package)) == [["grader.one", "grader.two"]]
