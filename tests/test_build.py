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
from grader.lesson_checks import BEGIN, END, LessonError, check_titles, checks_block, with_checks


def test_committed_files_are_what_the_build_writes():
    stale = [str(path.relative_to(COURSE_ROOT)) for path in stale_files(generated_files())]
    assert not stale, f"run `mha-course build`: out of date: {stale}"


def test_every_figure_in_a_lesson_folder_is_one_its_figures_py_draws():
    """A figure a chapter's figures.py no longer draws (renamed, or the scaffold's
    first draft) is left behind by the build, which only writes: it must go."""
    drawn = {path for path in generated_files() if path.suffix == ".svg"}
    lying = [str(path.relative_to(COURSE_ROOT)) for path in (COURSE_ROOT / "chapters").glob("*/figures/*.svg")
             if path not in drawn]
    assert not lying, f"no figures.py draws these; delete them: {lying}"


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
    """A copy of the course's sources, checks and exercises, as the build last wrote them."""
    for folder in ("solutions", "chapters", "exercises", "grader"):
        shutil.copytree(COURSE_ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
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


# -- what each lesson says its checks try ----------------------------------------------

NEW_CHECK = '''

@exercise("padding_mask")
def test_padding_mask_is_bool(submission):
    """gives a mask of dtype torch.bool, never 0 and 1 in integers"""
'''


def _build(course, *options: str) -> subprocess.CompletedProcess:
    """``mha-course build`` run in ``course``, a copy of the course with its own grader."""
    return subprocess.run([sys.executable, "-m", "grader", "build", *options], capture_output=True, text=True,
                          cwd=course, timeout=300)


def test_a_check_added_without_a_build_fails_build_check_naming_its_lesson(course):
    """A new check's sentence belongs in its lesson's list of checks: until
    ``mha-course build`` writes it there (and into the notebook, which
    carries the lesson), ``build --check`` fails and names the lesson; the
    build changes nothing of the lesson outside its markers."""
    chapter = next(chapter for chapter in CHAPTERS if chapter.id == "ch02")
    checks = course / "grader" / "chapters" / chapter.id / chapter.checks.name
    checks.write_text(checks.read_text(encoding="utf-8") + NEW_CHECK, encoding="utf-8")
    lesson = chapter.lesson(course)
    before = lesson.read_text(encoding="utf-8")
    checked = _build(course, "--check")
    assert checked.returncode == 1, checked.stderr
    assert sorted(checked.stderr.splitlines()) == [f"out of date: {path}" for path in (
        f"chapters/{chapter.folder}/README.md", f"exercises/{RECORD}", f"exercises/{chapter.module}.ipynb")]
    assert (built := _build(course)).returncode == 0, built.stderr
    after = lesson.read_text(encoding="utf-8")
    sentence = "<li>gives a mask of dtype torch.bool, never 0 and 1 in integers</li>"
    assert sentence not in before and after.count(sentence) == 1
    begin, end = after.index(BEGIN), after.index(END)
    assert begin < after.index(sentence) < end
    assert after[:begin] == before[:before.index(BEGIN)] and after[end:] == before[before.index(END):]
    assert sentence in chapter.notebook(course).read_text(encoding="utf-8")
    assert _build(course, "--check").returncode == 0


def test_a_lesson_without_its_markers_is_refused_in_one_line(course):
    """The build never guesses where a lesson's list goes: a lesson that lost
    a marker is refused, named, with the recipe, and nothing is written."""
    chapter = CHAPTERS[2]
    lesson = chapter.lesson(course)
    text = lesson.read_text(encoding="utf-8")
    lesson.write_text(text.replace(END + "\n", ""), encoding="utf-8")
    stubs = sorted(path.read_text() for path in (course / "exercises").iterdir())
    built = _build(course)
    assert built.returncode == 2 and built.stdout == ""
    (line,) = built.stderr.splitlines()
    assert line.startswith(f"error: chapters/{chapter.folder}/README.md: needs one line {BEGIN}")
    assert line.endswith("see grader/README.md, Adding a chapter")
    assert sorted(path.read_text() for path in (course / "exercises").iterdir()) == stubs


@pytest.mark.parametrize("lesson, problem", [
    ("# Lesson\n\nNo list here.\n", "found 0 and 0"),
    (f"{BEGIN}\n{BEGIN}\n{END}\n", "found 2 and 1"),
    (f"{END}\nbetween\n{BEGIN}\n", f"its line {END} comes before its line {BEGIN}"),
], ids=["no-markers", "two-begins", "end-first"])
def test_markers_that_are_missing_or_broken_are_refused(lesson, problem):
    with pytest.raises(LessonError, match=re.escape(problem)) as refused:
        with_checks(lesson, "the list", "chapters/09_x/README.md")
    assert str(refused.value).startswith("chapters/09_x/README.md: ")
    assert str(refused.value).endswith("see grader/README.md, Adding a chapter")


def test_only_the_text_between_the_markers_is_the_builds():
    lesson = f"# Title\n\nIntro  \n{BEGIN}\nan old list\n{END}\n\nAfter, with `code`.\n"
    assert with_checks(lesson, "the new list") == (
        f"# Title\n\nIntro  \n{BEGIN}\nthe new list\n{END}\n\nAfter, with `code`.\n")


CHECKS_FILE = '''
import pytest
from grader.checks import exercise, portability_check, portable

CASES = [1, 2, 3]


def helper():
    """not a check"""


@exercise("combine_masks")
@pytest.mark.parametrize("case", CASES)
def test_combine(submission, case):
    """allows a pair only where both masks allow it."""


@exercise("padding_mask")
@pytest.mark.parametrize("case", CASES)
def test_padding(submission, case):
    """matches the reference
    on every case, which this second line says more about"""


@exercise("padding_mask")
def test_padding_lengths(submission):
    """row b holds lengths[b] Trues, with a < and an &"""


test_would_run_on_a_gpu = portability_check([
    portable("padding_mask", lambda inputs: ((), {})),
    portable("cross_attention", lambda inputs: ((), {})),
])
'''


def _checks_in(course, text: str):
    chapter = next(chapter for chapter in CHAPTERS if chapter.id == "ch02")
    (course / "grader" / "chapters" / chapter.id / chapter.checks.name).write_text(text, encoding="utf-8")
    return chapter


def test_the_list_holds_each_check_once_in_the_reports_words(course):
    """A parametrized check is one sentence, the docstring's first line as
    the report shows it; exercises come in the catalog's order and checks
    in the file's; the portability check is under each exercise it names."""
    chapter = _checks_in(course, CHECKS_FILE)
    from grader.checks import portability_check

    portable_title = portability_check([]).__doc__.strip().splitlines()[0].rstrip(".")  # as check_title reads it
    assert check_titles(chapter, course) == {
        "padding_mask": ["matches the reference", "row b holds lengths[b] Trues, with a < and an &", portable_title],
        "convert_mask": [],
        "combine_masks": ["allows a pair only where both masks allow it"],
        "cross_attention": [portable_title],
    }
    block = checks_block(check_titles(chapter, course))
    assert "<li>row b holds lengths[b] Trues, with a &lt; and an &amp;</li>" in block
    assert "<summary><code>convert_mask</code></summary>\n<ul>\n<li>no check yet</li>" in block


@pytest.mark.parametrize("text, problem", [
    ('@exercise("padding_mask")\ndef test_x(submission):\n    pass\n', "test_x has no docstring"),
    ('@exercise("no_such")\ndef test_x(submission):\n    """a sentence"""\n', "a check of 'no_such'"),
    ('def test_x(submission):\n    """a sentence"""\n', "test_x needs one @exercise"),
    ("test_x = make_check()\n", "define it with def"),
], ids=["no-docstring", "unknown-exercise", "no-exercise", "made-otherwise"])
def test_a_check_the_list_cannot_read_is_refused_with_its_line(course, text, problem):
    source = "import pytest\n\n" + text
    chapter = _checks_in(course, source)
    with pytest.raises(LessonError, match=re.escape(problem)) as refused:
        check_titles(chapter, course)
    line = next(number for number, code in enumerate(source.splitlines(), start=1) if "test_x" in code)
    assert str(refused.value).startswith(f"grader/chapters/ch02/{chapter.checks.name}:{line}: ")
