"""Which file of a submission is a chapter's: one walker and one naming rule
(``finding.find_chapters``) for ``mha-course batch`` and the Gradescope
autograder, and ``best_file`` among several.

The agreement tests run both front ends on the same folder with the checks
replaced by a stand-in that passes every exercise of the files it is given:
what is tested is which file each one grades and how its results name it,
not the checks (tests/test_batch.py and tests/test_gradescope.py grade for real).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import NO_SUCH_CHAPTER
from grader import batch, class_folder, gradescope, hosted, reaping
from grader.catalog import CHAPTERS, COURSE_ROOT, UnknownChapter, chapter_in_name, find_chapter
from grader.finding import MAX_FOLDER_DEPTH, chapter_choice, find_chapters, submission_files
from grader.gradescope import missing_reason, with_missing_chapters
from grader.notebooks import notebook_text

CH01, CH02 = find_chapter("ch01"), find_chapter("ch02")
PY, NB = CH01.file_name, f"{CH01.module}.ipynb"
SOLUTION = (COURSE_ROOT / "solutions" / PY).read_text(encoding="utf-8")
STUB = (COURSE_ROOT / "exercises" / PY).read_text(encoding="utf-8")
WORKED_NOTEBOOK = notebook_text(CH01, SOLUTION, COURSE_ROOT, "solutions")


def write(path: Path, text: str, age: float = 0.0) -> Path:
    """Write a file; ``age`` seconds in the past, to say which was saved last."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if age:
        stamp = time.time() - age
        os.utime(path, (stamp, stamp))
    return path


# -- the naming rule -----------------------------------------------------------------


@pytest.mark.parametrize("name, chapter", [
    ("alice_ch01.py", "ch01"), ("ch02_cross_attention.ipynb", "ch02"), ("Bob-CH3.py", "ch03"),
    ("ch05.ipynb", "ch05"), ("rich01.py", None), ("attention.py", None),
])
def test_the_chapter_comes_from_chNN_as_a_word_of_the_name(name, chapter):
    found = chapter_in_name(name)
    assert (found.id if found else None) == chapter


def test_a_chapter_number_the_course_lacks_is_an_error():
    with pytest.raises(UnknownChapter, match=f"{NO_SUCH_CHAPTER}.*does not have"):
        chapter_in_name(f"eve_{NO_SUCH_CHAPTER}.py")


# -- the walker and the choice -------------------------------------------------------


def test_a_worked_notebook_beats_a_newer_untouched_py(tmp_path):
    write(tmp_path / NB, WORKED_NOTEBOOK, age=60)
    write(tmp_path / PY, STUB)  # saved last, but nothing written in it
    found = find_chapters(tmp_path)
    assert found.chosen == {"ch01": tmp_path / NB}
    assert found.sources() == {"ch01": f"{NB} (it has more written than {PY})"}
    assert found.ignored == [f"{PY}: ch01 was graded from {NB}"]


def test_of_files_as_written_the_exercise_name_comes_before_a_name_holding_chNN(tmp_path):
    write(tmp_path / PY, SOLUTION, age=60)
    write(tmp_path / "alice_ch01.ipynb", WORKED_NOTEBOOK)
    found = find_chapters(tmp_path)
    assert found.chosen == {"ch01": tmp_path / PY}
    assert found.sources() == {"ch01": f"{PY} (named like the exercise, unlike alice_ch01.ipynb)"}
    assert found.ignored == [f"alice_ch01.ipynb: ch01 was graded from {PY}"]


def test_work_under_a_name_of_ones_own_beats_the_untouched_stub(tmp_path):
    write(tmp_path / "alice_ch01.py", SOLUTION, age=60)
    write(tmp_path / PY, STUB)  # named like the exercise, saved last, nothing written
    found = find_chapters(tmp_path)
    assert found.chosen == {"ch01": tmp_path / "alice_ch01.py"}
    assert found.sources() == {"ch01": f"alice_ch01.py (it has more written than {PY})"}


def test_a_name_holding_chNN_counts_when_the_exercise_name_is_absent(tmp_path):
    write(tmp_path / "alice_ch01.ipynb", WORKED_NOTEBOOK)
    write(tmp_path / "rich01.py", "x = 1\n")
    write(tmp_path / f"eve_{NO_SUCH_CHAPTER}.py", "x = 1\n")
    found = find_chapters(tmp_path)
    assert found.chosen == {"ch01": tmp_path / "alice_ch01.ipynb"}
    assert found.unnamed == [f"eve_{NO_SUCH_CHAPTER}.py", "rich01.py"]


def test_folders_are_looked_through_to_the_depth_limit_and_no_further(tmp_path):
    assert MAX_FOLDER_DEPTH == 3
    write(tmp_path / "alice" / "hw1" / "exercises" / PY, SOLUTION)  # three folders down
    write(tmp_path / "a" / "b" / "c" / "d" / CH02.file_name, SOLUTION)  # four: too deep
    assert find_chapters(tmp_path).chosen == {"ch01": tmp_path / "alice" / "hw1" / "exercises" / PY}


def test_hidden_folders_caches_and_links_are_never_graded(tmp_path):
    # Jupyter's checkpoint copy holds chNN in its name, and is newer than nothing.
    write(tmp_path / ".ipynb_checkpoints" / f"{CH01.module}-checkpoint.ipynb", WORKED_NOTEBOOK)
    write(tmp_path / "__MACOSX" / NB, "metadata")
    (tmp_path / CH02.file_name).symlink_to(CH02.solution())
    found = find_chapters(tmp_path)
    assert found.chosen == {}
    assert found.ignored == [f"{CH02.module}.py: a link, not a file to grade"]


def test_files_of_chapters_the_assignment_leaves_out_are_listed(tmp_path):
    write(tmp_path / PY, SOLUTION)
    found = find_chapters(tmp_path, [CH02])
    assert found.chosen == {} and found.ignored == [f"{PY}: ch01 is not graded in this assignment"]


# -- grade --dir: the same rule ------------------------------------------------------


@pytest.mark.parametrize("name", ["alice_ch01.py", "ch1_attention.py", f"hw1/{PY}"])
def test_grade_dir_finds_the_file_batch_and_gradescope_find(tmp_path, name):
    write(tmp_path / name, SOLUTION)
    write(tmp_path / "notes.py", "x = 1\n")
    assert find_chapters(tmp_path).chosen == {"ch01": tmp_path / name}
    assert chapter_choice(CH01, tmp_path) == (tmp_path / name, "")
    assert chapter_choice(CH02, tmp_path) is None


def test_grade_without_targets_takes_one_file_a_chapter_and_says_why(tmp_path):
    from grader.cli import resolve_targets

    write(tmp_path / NB, WORKED_NOTEBOOK, age=60)
    write(tmp_path / PY, STUB)  # saved last, but nothing written in it
    write(tmp_path / "bob_ch02.py", "x = 1\n")
    write(tmp_path / CH02.file_name, "x = 1\n")
    assert resolve_targets([], tmp_path) == [
        (CH01, tmp_path / NB, f"it has more written than {PY}"),
        (CH02, tmp_path / CH02.file_name, "named like the exercise, unlike bob_ch02.py")]


# -- batch and Gradescope agree --------------------------------------------------------


@pytest.fixture
def checks_pass(monkeypatch):
    """Replace the checks by a stand-in that passes every exercise of the
    files it is given, and records them: ``checks_pass.graded`` holds
    ``{chapter id: the text graded}`` of the last grade."""
    from grader.grading import ExerciseResult, GradeReport

    def grade(targets, device=None, limits=None, seed=None, only=None, jobs=1, account=None):
        checks_pass.graded = {chapter.id: path.read_text(encoding="utf-8") for chapter, path in targets}
        results = [ExerciseResult(chapter, exercise, "passed", "all checks passed", [])
                   for chapter, _ in targets for exercise in chapter.exercises]
        return GradeReport(results, seed=seed or 0)

    monkeypatch.setattr("grader.grading.grade", grade)
    # Gradescope's runner changes user and stops what a submission left
    # running: not in the test's own process.
    monkeypatch.setattr(hosted, "worker_account", lambda user: (None, ""))
    monkeypatch.setattr(reaping, "stop_descendants", lambda *args, **kwargs: 0)
    return checks_pass


def graded_by_batch(folder: Path, checks_pass) -> tuple[dict, dict]:
    """The results JSON ``mha-course batch`` writes for a student's ``folder``,
    and the files it graded."""
    (entry,) = [entry for entry in class_folder.list_entries(folder.parent) if entry.paths == (folder,)]
    checks_pass.graded = None
    return batch.grade_student(entry, batch.GradingOptions(seed=9)).results, checks_pass.graded


def graded_by_gradescope(folder: Path, root: Path, checks_pass) -> tuple[dict, dict]:
    """The results.json the Gradescope autograder writes for ``folder`` as
    the submission, and the files it graded."""
    shutil.copytree(folder, root / "submission")  # copy2: the times of saving are kept
    checks_pass.graded = None
    results = gradescope.grade_submission(root, CHAPTERS, log=lambda line: None)
    return results, checks_pass.graded


LAYOUTS = {
    # The notebook worked in; the untouched .py saved after it.
    "notebook-and-newer-stub": ({NB: (WORKED_NOTEBOOK, 60), PY: (STUB, 0)},
                                NB, f"{NB} (it has more written than {PY})"),
    "nested-folders": ({f"hw1/exercises/{PY}": (SOLUTION, 0), "hw1/README.md": ("notes", 0)},
                       f"hw1/exercises/{PY}", f"hw1/exercises/{PY}"),
    "own-name": ({"alice_ch01.ipynb": (WORKED_NOTEBOOK, 0), "scratch.py": ("x = 1\n", 0)},
                 "alice_ch01.ipynb", "alice_ch01.ipynb"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_batch_and_gradescope_grade_the_same_file_and_name_it(tmp_path, checks_pass, layout):
    files, graded_file, source = LAYOUTS[layout]
    folder = tmp_path / "class" / "alice"
    for name, (text, age) in files.items():
        write(folder / name, text, age)
    in_batch, batch_graded = graded_by_batch(folder, checks_pass)
    in_gradescope, gradescope_graded = graded_by_gradescope(folder, tmp_path / "autograder", checks_pass)

    expected_text = (folder / graded_file).read_text(encoding="utf-8")
    assert batch_graded == gradescope_graded == {"ch01": expected_text}
    for results in (in_batch, in_gradescope):
        assert results["extra_data"]["files"] == {"ch01": graded_file}
        assert f"ch01: graded {source}" in results["output"].splitlines()
    # Every exercise, the missing chapters' at 0 with the same reason, in both.
    assert in_batch["tests"] == in_gradescope["tests"]
    assert in_batch["score"] == in_gradescope["score"] == CH01.points
    assert in_batch["max_score"] == in_gradescope["max_score"] == sum(chapter.points for chapter in CHAPTERS)


# -- missing chapters: 0-point tests, in one place --------------------------------------------


def test_missing_chapters_become_zero_point_tests_with_their_reason():
    graded = {"output": "ch01: graded ch01_self_attention.py", "execution_time": 1.5, "tests": [
        {"name": f"ch01 {exercise.name}: {exercise.summary}", "score": exercise.points,
         "max_score": exercise.points, "status": "passed", "output": "all checks passed",
         "visibility": "visible"} for exercise in CH01.exercises]}
    chapters = [CH01, CH02, find_chapter("ch03")]
    results = with_missing_chapters(graded, chapters, {"ch03": "ch03 not graded: not UTF-8"})

    assert results["tests"][:len(CH01.exercises)] == graded["tests"]  # graded tests as they were
    outputs = {test["name"].split()[0]: test["output"] for test in results["tests"][len(CH01.exercises):]}
    assert outputs == {"ch02": missing_reason(CH02), "ch03": "ch03 not graded: not UTF-8"}
    assert [test["name"].split(":")[0] for test in results["tests"]] == \
        [f"{chapter.id} {exercise.name}" for chapter in chapters for exercise in chapter.exercises]
    assert results["score"] == CH01.points
    assert results["max_score"] == sum(chapter.points for chapter in chapters)
    assert results["output"] == graded["output"] and results["execution_time"] == 1.5
    assert missing_reason(CH02) == f"no file for ch02 in the submission (expected {CH02.module}.py " \
                                   f"or {CH02.module}.ipynb)"


NO_WORK = (".git", ".DS_Store", ".ipynb_checkpoints", "._ch01_self_attention.py", "__MACOSX", "__pycache__",
           "Thumbs.db", "desktop.ini")


def test_one_rule_leaves_out_what_holds_no_work_in_a_class_a_folder_and_a_zip(tmp_path):
    """A class folder's entries, a student's files and a zip's members are
    left out by one rule (finding.holds_no_work), name by name."""
    import zipfile

    from grader.class_folder import _ignored_member, entry_paths

    class_folder = tmp_path / "class"
    student = tmp_path / "student"
    for name in NO_WORK:
        (class_folder / name).mkdir(parents=True)
        (student / name).mkdir(parents=True)
        (student / name / CH01.file_name).write_text("x = 1\n", encoding="utf-8")
    (class_folder / "alice").mkdir()
    (student / CH01.file_name).write_text("x = 1\n", encoding="utf-8")
    assert [path.name for path in entry_paths(class_folder)] == ["alice"]
    assert submission_files(student) == ([student / CH01.file_name], [])
    for name in NO_WORK:
        assert _ignored_member(zipfile.ZipInfo(f"alice/{name}/{CH01.file_name}"))
    assert not _ignored_member(zipfile.ZipInfo(f"alice/{CH01.file_name}"))
