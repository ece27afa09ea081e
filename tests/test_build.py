"""The build writes the stubs and figures from the solutions, and they are committed as written."""

import ast
import json
import re
import shutil
import subprocess
import sys

import pytest

from grader.build import (
    RECORD,
    MarkerError,
    edited_files,
    generated_files,
    stale_files,
    stub_source,
    write_files,
)
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
    solution = chapter.solution().read_text()
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


# -- work in exercises/ is never lost ------------------------------------------------


@pytest.fixture
def course(tmp_path):
    """A copy of the course's sources and exercises, as the build last wrote them."""
    for folder in ("solutions", "chapters", "exercises"):
        shutil.copytree(COURSE_ROOT / folder, tmp_path / folder)
    return tmp_path


def test_the_build_leaves_an_edited_exercise_alone_and_updates_the_rest(course):
    work = course / "exercises" / "ch01_self_attention.py"
    work.write_text(work.read_text() + "\n# my softmax, half done\n")
    solution = course / "solutions" / "ch02_cross_attention.py"
    solution.write_text(solution.read_text().replace("Which positions", "Where the positions", 1))
    files = generated_files(course, figures=False)
    assert edited_files(files) == [work]
    written, edited = write_files(files)
    assert edited == {work: None}
    assert work.read_text().endswith("# my softmax, half done\n")
    assert course / "exercises" / "ch02_cross_attention.py" in written  # a stale stub is rewritten
    # The record still holds what the build wrote into ch01 before: the file stays work.
    assert edited_files(generated_files(course, figures=False)) == [work]
    assert write_files(generated_files(course, figures=False)) == ([], {work: None})


def test_force_overwrites_an_edited_exercise_and_keeps_a_copy(course):
    work = course / "exercises" / "ch03_multi_head_attention.ipynb"
    edits = work.read_text().replace('"cells": [', '"cells": [ ', 1)
    work.write_text(edits)
    written, edited = write_files(generated_files(course, figures=False), force=True)
    (copy,) = edited.values()
    assert copy.parent == work.parent and copy.name.startswith(work.name) and copy.suffix == ".bak"
    assert copy.read_text() == edits
    assert work in written and work.read_text() == generated_files(course, figures=False)[work]


# -- notebooks for instructors ---------------------------------------------------


def test_the_instructors_notebooks_link_figures_that_travel_with_them(tmp_path):
    """``build --with-solutions DIR`` copies the figures into DIR: the notebooks'
    links work from DIR, wherever DIR is, even moved out of the course."""
    done = subprocess.run([sys.executable, "-m", "grader", "build", "--with-solutions", str(tmp_path / "made")],
                          capture_output=True, text=True, cwd=COURSE_ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    folder = (tmp_path / "made").rename(tmp_path / "moved")
    for chapter in CHAPTERS:
        notebook = (folder / f"{chapter.module}.ipynb").read_text(encoding="utf-8")
        lesson = "\n".join("".join(cell["source"]) for cell in json.loads(notebook)["cells"]
                           if cell["cell_type"] == "markdown")
        links = re.findall(r"\]\(([^)\s]+)\)", lesson)
        local = [link for link in links if not re.match(r"[a-z]+:|#", link)]
        assert any("/figures/" in link for link in local), chapter.id
        for link in local:
            assert not link.startswith(("/", "..")), link
            copy = folder / link.split("#")[0]
            assert copy.is_file(), f"{chapter.id} links to {link}, not in {folder.name}/"
            assert copy.read_bytes() == (COURSE_ROOT / link.split("#")[0]).read_bytes()


def test_without_a_record_every_exercise_that_would_change_counts_as_work(course):
    (course / "exercises" / RECORD).unlink()
    stub = course / "exercises" / "ch05_rope.py"
    stub.write_text(stub.read_text() + "\n")
    assert edited_files(generated_files(course, figures=False)) == [stub]


def test_a_wrapped_try_cell_runs_as_written_and_says_what_is_not_written(capsys):
    """The build puts each try and plot cell under ``try:`` so that a stub's
    NotImplementedError does not stop Run All; what the cell computes, its
    strings included, is what it was."""
    from grader.notebooks import NOT_WRITTEN, until_written

    code = 'text = """two\n  lines"""\nfor line in text.splitlines():\n    print(line)\n\nprint(len(text))'
    expected, wrapped = {}, {}
    exec(code, expected)
    exec(until_written(code), wrapped)
    assert wrapped["text"] == expected["text"]
    unwritten = "def softmax(x):\n    raise NotImplementedError\n\nsoftmax(1)\nprint('unreached')"
    exec(until_written(unwritten), {})
    exec(until_written("print(model)", plot=True), {})
    assert capsys.readouterr().out.splitlines()[-2:] == [
        NOT_WRITTEN, "Not drawn yet: model is made by a cell above, which has not run to the end."]
