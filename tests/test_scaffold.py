"""``mha-course new-chapter`` and the proof that a new chapter is covered.

Every test that writes a chapter does it in a copy of the course (the files
git knows, in tmp_path), and runs the copy's own grader there: ``cwd`` and
``PYTHONPATH`` are the copy, never this tree. The acceptance test (issue
31) adds a throw-away chapter 13: the scaffold's skeleton, filled in with
the small complete chapter of tests/new_chapter/, and shows that the
suite's per-chapter tests take it in and that a part taken away fails with
a message naming it.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from grader.catalog import CHAPTERS, COURSE_ROOT
from grader.scaffold import ScaffoldError, catalog_entry, plan, with_catalog_entry
from test_chapter_parts import PARTS

NEW_CHAPTER = COURSE_ROOT / "tests" / "new_chapter"  # the data: chapter 13, at its paths in the course
NUMBER, SLUG, TITLE = 13, "sliding_window", "Sliding-window attention"
EXERCISE = "sliding_window_mask"


def _course_copy(folder: Path) -> Path:
    """The course's files as git sees them (committed or not, ignored ones
    left out), copied into ``folder``."""
    if shutil.which("git") is None or not (COURSE_ROOT / ".git").exists():
        pytest.skip("the course is not a git checkout: no list of its files to copy")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=COURSE_ROOT, capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = COURSE_ROOT / name
        if source.is_file():  # a file deleted but not yet committed is listed too
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / name)
    return folder


def _run(copy: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python ARGS`` in the copy, importing the copy's grader."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(copy)
    return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _new_chapter(copy: Path, *extra: str) -> subprocess.CompletedProcess:
    return _run(copy, "-m", "grader", "new-chapter", str(NUMBER), SLUG, TITLE, *extra)


def _failed(run: subprocess.CompletedProcess) -> set[str]:
    """The tests a ``pytest -q`` run reports failed: ``name[id]``."""
    return set(re.findall(r"^FAILED \S+::(\w+\[[^\]]+\])", run.stdout, flags=re.MULTILINE))


def _inserted(before: str, after: str) -> list[str]:
    """The lines ``after`` adds to ``before`` in one place; fails on any other change."""
    old, new = before.splitlines(), after.splitlines()
    changes = [opcode for opcode in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
               if opcode[0] != "equal"]
    assert len(changes) == 1 and changes[0][0] == "insert", changes
    _, _, _, start, end = changes[0]
    return new[start:end]


# -- the scaffold ------------------------------------------------------------------------


def test_the_skeleton_builds_grades_and_the_suite_says_what_is_left(tmp_path):
    copy = _course_copy(tmp_path)
    catalog_before = (copy / "grader" / "catalog.py").read_text(encoding="utf-8")
    readme_before = (copy / "README.md").read_text(encoding="utf-8")
    made = _new_chapter(copy)
    assert made.returncode == 0, made.stderr
    chapter_id, module = f"ch{NUMBER:02d}", f"ch{NUMBER:02d}_{SLUG}"
    created = {f"solutions/{module}.py", f"grader/chapters/{chapter_id}/__init__.py",
               f"grader/chapters/{chapter_id}/test_{module}.py", f"grader/chapters/{chapter_id}/bugs.py",
               f"grader/chapters/{chapter_id}/oracles.py", f"chapters/13_{SLUG}/README.md",
               f"chapters/13_{SLUG}/figures.py", f"chapters/13_{SLUG}/notebook.py", f"tests/test_{module}.py"}
    assert set(re.findall(r"^wrote (\S+)$", made.stdout, flags=re.MULTILINE)) == created | {
        "grader/catalog.py", "README.md"}
    for name in created - {f"grader/chapters/{chapter_id}/__init__.py"}:
        assert "TODO" in (copy / name).read_text(encoding="utf-8"), name
    # catalog.py and README.md gain the entry and the row, and change nowhere else.
    entry = _inserted(catalog_before, (copy / "grader" / "catalog.py").read_text(encoding="utf-8"))
    assert entry[0] == "    Chapter(" and f'        slug="{SLUG}",' in entry and entry[-1] == "    ),"
    readme = (copy / "README.md").read_text(encoding="utf-8")
    (row,) = _inserted(readme_before, readme)
    assert row.startswith(f"| [13](chapters/13_{SLUG}/README.md) | sliding-window attention |")
    lines = readme.splitlines()
    assert lines[lines.index(row) - 1].startswith("| [12](chapters/12_")

    # The skeleton builds and grades: the reference passes every check, the stub none.
    built = _run(copy, "-m", "grader", "build")
    assert built.returncode == 0, built.stderr
    graded = _run(copy, "-m", "grader", "grade", "--solutions", chapter_id)
    assert graded.returncode == 0 and "Total: 1 / 1 points" in graded.stdout, graded.stdout + graded.stderr

    # What is left is what the scaffold cannot write, each part named with its step.
    parts = _run(copy, "-m", "pytest", "-q", "-n0", "--tb=line", "tests/test_chapter_parts.py", "-k", chapter_id)
    assert _failed(parts) == {f"test_the_chapter_has_the_part[{chapter_id}-{part}]"
                              for part in ("known-bugs", "correct-styles", "mistakes", "snapshot")}
    assert "step 10, \"Correct styles\"" in parts.stdout and "tests/correct_styles/ch13_<style>.py" in parts.stdout

    # A second time it refuses, in one line, and writes nothing.
    before = {path: path.read_bytes() for path in copy.rglob("*") if path.is_file()}
    again = _new_chapter(copy)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.strip().splitlines() == ["error: chapter 13 exists already: ch13, sliding_window"]
    assert {path: path.read_bytes() for path in copy.rglob("*") if path.is_file()} == before


@pytest.fixture
def course(tmp_path) -> Path:
    """The two files the scaffold edits, alone in a folder: enough for ``plan``."""
    (tmp_path / "grader").mkdir()
    shutil.copy2(COURSE_ROOT / "grader" / "catalog.py", tmp_path / "grader" / "catalog.py")
    shutil.copy2(COURSE_ROOT / "README.md", tmp_path / "README.md")
    return tmp_path


@pytest.mark.parametrize("number, slug, title, exercises, reason", [
    (CHAPTERS[2].number, "new_slug", "A title", ("example",), f"chapter {CHAPTERS[2].number} exists already"),
    (NUMBER, CHAPTERS[4].slug, "A title", ("example",), f"slug '{CHAPTERS[4].slug}' is chapter"),
    (NUMBER, "Sliding-Window", "A title", ("example",), "is not lowercase words"),
    (NUMBER, "sliding__window", "A title", ("example",), "is not lowercase words"),
    (NUMBER, "ch10_extra", "A title", ("example",), "would read as a chapter number"),
    (0, SLUG, "A title", ("example",), "is not between 1 and 99"),
    (100, SLUG, "A title", ("example",), "is not between 1 and 99"),
    (NUMBER, SLUG, "  ", ("example",), "the title is one line"),
    (NUMBER, SLUG, "A title", ("class",), "is not a Python name"),
    (NUMBER, SLUG, "A title", ("mask", "mask"), "named twice"),
], ids=["number-taken", "slug-taken", "slug-case", "slug-double-underscore", "slug-like-an-id", "number-0",
        "number-100", "no-title", "keyword", "twice"])
def test_new_chapter_refuses_a_taken_or_malformed_name(course, number, slug, title, exercises, reason):
    with pytest.raises(ScaffoldError, match=re.escape(reason)):
        plan(course, number, slug, title, exercises)


def test_new_chapter_refuses_to_write_over_a_file(course):
    planned = plan(course, NUMBER, SLUG, TITLE)
    assert planned.created and not any(path.exists() for path in planned.created)
    lesson = course / "chapters" / f"13_{SLUG}" / "README.md"
    lesson.parent.mkdir(parents=True)
    lesson.write_text("someone's draft\n", encoding="utf-8")
    with pytest.raises(ScaffoldError, match=rf"chapters/13_{SLUG}/README.md exists already"):
        plan(course, NUMBER, SLUG, TITLE)
    assert lesson.read_text(encoding="utf-8") == "someone's draft\n"


def test_the_catalog_entry_is_added_last_and_reads_back_as_the_chapter():
    catalog = (COURSE_ROOT / "grader" / "catalog.py").read_text(encoding="utf-8")
    chapter = plan(COURSE_ROOT, NUMBER, SLUG, 'It\'s "quoted"', ("a", "b")).chapter
    edited = with_catalog_entry(catalog, catalog_entry(chapter))
    (tuple_node,) = [node.value for node in ast.parse(edited).body
                     if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "CHAPTERS"
                     or isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["CHAPTERS"]]
    last = tuple_node.elts[-1]
    assert len(tuple_node.elts) == len(CHAPTERS) + 1
    fields = {keyword.arg: keyword.value for keyword in last.keywords}
    assert ast.literal_eval(fields["title"]) == 'It\'s "quoted"' and ast.literal_eval(fields["number"]) == NUMBER
    assert [ast.literal_eval(item.args[0]) for item in fields["exercises"].elts] == ["a", "b"]
    with pytest.raises(ScaffoldError, match="add the entry by hand"):
        with_catalog_entry(catalog.replace("\n    ),\n)\n", "\n    ))\n"), catalog_entry(chapter))


# -- the acceptance test: a new chapter is covered ---------------------------------------------


def _add_chapter_nine(copy: Path) -> None:
    """The skeleton, then tests/new_chapter/'s files over it, the build, and
    the chapter's entries in the grades snapshot."""
    made = _new_chapter(copy, "--exercise", EXERCISE)
    assert made.returncode == 0, made.stderr
    data = sorted(path for path in NEW_CHAPTER.rglob("*") if path.is_file() and path.parent != NEW_CHAPTER
                  and "__pycache__" not in path.parts)
    for path in data:
        shutil.copy2(path, copy / path.relative_to(NEW_CHAPTER))
    written = set(re.findall(r"^wrote (\S+)$", made.stdout, flags=re.MULTILINE)) - {"grader/catalog.py", "README.md"}
    # The data fills in every file the skeleton drafted, and adds only the correct styles.
    assert written <= {path.relative_to(NEW_CHAPTER).as_posix() for path in data}
    built = _run(copy, "-m", "grader", "build")
    assert built.returncode == 0, built.stderr
    # The snapshot is the whole course's grades (a minute to compute, python
    # tests/test_same_grades.py); the part test looks for the chapter's entries.
    snapshot = copy / "tests" / "snapshots" / "grades.json"
    grades = json.loads(snapshot.read_text(encoding="utf-8"))
    for edition in ("solutions", "stubs"):
        grades[edition]["exercises"].append({"chapter": "ch13", "exercise": EXERCISE})
    snapshot.write_text(json.dumps(grades), encoding="utf-8")


def _per_chapter_tests(collected: str) -> dict[str, set[str]]:
    """``{test: chapter ids among its parameters}`` for the collected tests
    parametrized over the chapters: those whose ids name each of the
    course's chapters (``ch01``, ``ch01-lesson``, ``ch01/softmax/no-scale``,
    ``ch01_einsum``)."""
    found: dict[str, set[str]] = defaultdict(set)
    for test, parameters in re.findall(r"^(tests/\S+?::\w+)\[(.+)\]$", collected, flags=re.MULTILINE):
        found[test] |= set(re.findall(r"(?<![a-z0-9])(ch\d\d)(?![0-9])", parameters))
    return {test: ids for test, ids in found.items() if {chapter.id for chapter in CHAPTERS} <= ids}


# After a pytest run, on the line after this one, the test ids it collected before
# ``-k`` chose which to run, as ``--collect-only -q`` lists them, and the collection errors.
COLLECTED = "-- collected --"
_COLLECTING = f"""
import json, sys
import pytest


class Collected:
    def __init__(self):
        self.ids, self.errors = [], []

    @pytest.hookimpl(tryfirst=True)  # before -k deselects
    def pytest_collection_modifyitems(self, items):
        self.ids = [item.nodeid for item in items]

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(report.nodeid)


collected = Collected()
code = pytest.main(sys.argv[1:], plugins=[collected])
print({COLLECTED!r})
print(json.dumps({{"ids": collected.ids, "errors": collected.errors}}))
sys.exit(code)
"""


def _collect_and_run(copy: Path, *args: str) -> subprocess.CompletedProcess:
    """``pytest ARGS`` in the copy, its stdout followed by ``COLLECTED`` and
    what the run collected (``{"ids": [...], "errors": [...]}``)."""
    return _run(copy, "-c", _COLLECTING, *args)


def test_a_new_chapter_is_covered_by_every_per_chapter_test_and_a_missing_part_is_named(tmp_path):
    copy = _course_copy(tmp_path)
    _add_chapter_nine(copy)
    assert _run(copy, "-c", "import grader; print(grader.__file__)").stdout.startswith(str(copy))

    # (a) Each test parametrized over the chapters has a ch13 case too, and (b) it has
    # every part: one pytest run of the copy gives both (a start of pytest there, with
    # its conftest, is 10 s), collecting the whole suite (testpaths) as
    # ``--collect-only`` did, and running the part tests of ch13 alone (``_collect_and_run``).
    run = _collect_and_run(copy, "-q", "-n0", "-k", "test_chapter_parts and ch13")
    assert COLLECTED in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    collected = json.loads(run.stdout.rsplit(COLLECTED, 1)[1])
    assert collected["errors"] == [], run.stdout[-3000:] + run.stderr[-2000:]
    per_chapter = _per_chapter_tests("\n".join(collected["ids"]))
    assert len(per_chapter) >= 20 and {
        "tests/test_chapter_parts.py::test_the_chapter_has_the_part",
        "tests/test_lessons.py::test_every_known_bug_is_named_by_a_pitfall_of_its_lesson",
        "tests/test_known_bugs.py::test_known_bug_fails_its_exercise_and_is_named",
        "tests/test_correct_styles.py::test_the_corpus_file_equals_the_reference",
    } <= set(per_chapter), sorted(per_chapter)
    assert sorted(test for test, ids in per_chapter.items() if "ch13" not in ids) == []

    # (b) It has every part.
    parts = run.stdout.rsplit(COLLECTED, 1)[0]
    assert run.returncode == 0 and f"{len(PARTS)} passed" in parts, parts[-3000:]

    # (c) A part taken away fails the test that looks for it, which names it.
    (copy / "tests" / "correct_styles" / "ch13_expand.py").unlink()
    tests = copy / "tests" / "test_ch13_sliding_window.py"
    tests.write_text(re.sub(r"^RELEASE_BUG = .*$", "", tests.read_text(encoding="utf-8"), flags=re.MULTILINE),
                     encoding="utf-8")
    lesson = copy / "chapters" / "13_sliding_window" / "README.md"
    lesson.write_text(lesson.read_text(encoding="utf-8").replace("<!-- known bugs: misses-itself -->", ""),
                      encoding="utf-8")
    broken = _run(copy, "-m", "pytest", "-q", "-n0", "--tb=short", "tests/test_chapter_parts.py",
                  "tests/test_lessons.py", "-k", "ch13")
    assert _failed(broken) == {"test_the_chapter_has_the_part[ch13-correct-styles]",
                               "test_the_chapter_has_the_part[ch13-chapter-tests]",
                               "test_every_known_bug_is_named_by_a_pitfall_of_its_lesson[ch13]"}, broken.stdout[-3000:]
    for message in ("(tests/correct_styles/ch13_<style>.py): holds 2 ch13_<style>.py",
                    "(tests/test_ch13_sliding_window.py): defines no RELEASE_BUG",
                    "no pitfall names sliding_window_mask/misses-itself"):
        assert message in broken.stdout, message
