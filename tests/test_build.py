"""The build writes the stubs and figures from the solutions, and they are committed as written."""

import ast

import pytest

from grader.build import MarkerError, generated_files, stale_files, stub_source
from grader.catalog import CHAPTERS, COURSE_ROOT


def test_committed_files_are_what_the_build_writes():
    stale = [str(path.relative_to(COURSE_ROOT)) for path in stale_files(generated_files())]
    assert not stale, f"run `mha-course build`: out of date: {stale}"


def _definitions(source: str) -> dict[str, str | None]:
    """``{name: docstring}`` of top-level functions and classes, and of methods as ``Class.name``."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = ast.get_docstring(node)
        if isinstance(node, ast.ClassDef):
            found.update({f"{node.name}.{m.name}": ast.get_docstring(m) for m in node.body
                          if isinstance(m, ast.FunctionDef)})
    return found


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.id for c in CHAPTERS])
def test_stub_keeps_signatures_and_hides_every_solution_line(chapter):
    solution = (COURSE_ROOT / "solutions" / f"{chapter.module}.py").read_text()
    stub = stub_source(solution)
    solution_defs = _definitions(solution)
    stub_defs = _definitions(stub)
    assert stub_defs == solution_defs  # same functions, classes and methods, same docstrings
    for exercise in chapter.exercises:
        assert exercise.name in stub_defs
    hidden = []
    inside = False
    for line in solution.splitlines():
        if line.strip() == "# BEGIN SOLUTION":
            inside = True
        elif line.strip() == "# END SOLUTION":
            inside = False
        elif inside and any(c.isalnum() for c in line) and not line.strip().startswith("#"):
            hidden.append(line.strip())  # a line of code, not a lone bracket
    assert hidden
    for line in hidden:
        assert line not in stub, f"solution line left in the stub: {line}"


def test_stub_body_replaces_each_block_at_its_indentation():
    solution = (
        "def f(x):\n"
        '    """Doc."""\n'
        "    # BEGIN SOLUTION\n"
        "    return x + 1\n"
        "    # END SOLUTION\n"
    )
    assert stub_source(solution) == (
        "def f(x):\n"
        '    """Doc."""\n'
        "    # YOUR CODE HERE\n"
        "    raise NotImplementedError\n"
    )


@pytest.mark.parametrize("text, problem", [
    ("# BEGIN SOLUTION\nx = 1\n", "never closed"),
    ("x = 1\n# END SOLUTION\n", "without a # BEGIN SOLUTION"),
    ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "inside the block opened at line 1"),
])
def test_unpaired_markers_are_errors_with_a_line(text, problem):
    with pytest.raises(MarkerError, match=problem):
        stub_source(text, "solutions/x.py")
