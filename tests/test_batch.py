"""Batch grading: a whole class in one command, as an instructor runs it.

Most of the class submits chapter 1 only, so that the batch stays fast on
CI's two cores: correct files and notebooks, untouched stubs, catalog bugs,
zips, and every kind of broken submission, each with the row it must get.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from rich.console import Console

from conftest import NO_SUCH_CHAPTER
from grader import batch, batch_state, class_folder
from grader.class_folder import Unusable, extract_zip, list_entries
from grader.catalog import CHAPTERS, COURSE_ROOT, find_chapter
from grader.known_bugs import KNOWN_BUGS, apply_bug
from grader.notebooks import notebook_text
from test_finding import checks_pass  # noqa: F401 - the fixture: checks that pass every exercise given

CH01, CH02 = find_chapter("ch01"), find_chapter("ch02")
SOLUTION = CH01.solution().read_text(encoding="utf-8")
STUB = CH01.stub().read_text(encoding="utf-8")
CH02_SOLUTION = CH02.solution().read_text(encoding="utf-8")
COURSE_POINTS = sum(chapter.points for chapter in CHAPTERS)
FULL = CH01.points  # 11
PY, NB = CH01.file_name, f"{CH01.module}.ipynb"


def with_bug(name: str) -> str:
    """Chapter 1's solution with the catalog bug ``name`` planted in the
    torch version of an exercise (the NumPy ones have bugs of the same names)."""
    (bug,) = [bug for bug in KNOWN_BUGS["ch01"] if bug.name == name and "numpy" not in bug.exercise]
    return apply_bug(SOLUTION, bug)


def notebook(code: str) -> str:
    return notebook_text(CH01, code, COURSE_ROOT, "solutions")


def write(path: Path, text: str | bytes, age: float = 0.0) -> Path:
    """Write a file; ``age`` seconds in the past, to say which was saved last."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    if age:
        stamp = time.time() - age
        os.utime(path, (stamp, stamp))
    return path


def zip_of(path: Path, members: dict[str, str | bytes], links: dict[str, str] | None = None) -> Path:
    """A zip with ``members`` (name -> content) and symbolic ``links`` (name -> target)."""
    with zipfile.ZipFile(path, "w") as bundle:
        for name, content in members.items():
            bundle.writestr(name, content)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            bundle.writestr(info, target)
    return path


def mha_course(*args: str, cwd: Path = COURSE_ROOT, columns: int = 200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "COLUMNS": str(columns)})


# -- the class -----------------------------------------------------------------------

# student -> (chapter-1 points, ch02 points, a phrase of the note or "")
EXPECTED = {
    "ada": (FULL, 0, ""),                # folder, the solution
    "ben": (0, 0, ""),                   # folder, the untouched stub
    "cy": (5, 0, ""),                    # no 1/sqrt(d): attention and self-attention fail
    "dee": (5, 0, ""),
    "eli": (5, 0, ""),
    "fay": (5, 0, ""),                   # softmax over the queries
    "gus": (5, 0, ""),
    "hal": (9, 0, ""),                   # x @ W instead of x @ W.T: self-attention fails
    "ian": (9, 0, ""),
    "jay": (5, 0, ""),                   # the mask inverted
    "ivy": (FULL, 0, ""),                # zip of a folder ivy/
    "jo": (FULL, 0, ""),                 # zip of a solved notebook, no folder
    "kim": (FULL, CH02.points, ""),      # two loose files, kim_ch01.py and kim_ch02.py
    "lea": (5, 0, ""),                   # a single notebook, lea_ch01_self_attention.ipynb, no 1/sqrt(d)
    "max": (FULL, 0, ""),                # stub .py, then the solved notebook saved later
    "ned": (FULL, 0, ""),                # solved notebook, then the stub .py saved later: the work wins
    "ola": (FULL, CH02.points, ""),      # two chapters
    "pat": (0, 0, "the submission is empty"),
    "quinn": (0, 0, "not a valid zip file"),
    "rae": (0, 0, "holds a path outside its folder"),
    "sam": (0, 0, "holds a symbolic link"),
    "tia": (0, 0, "not valid notebook JSON"),
    "uma": (0, 0, "not UTF-8"),
    "vic": (0, 0, "cannot tell which chapter vic.py is for"),
    "wes.txt": (0, 0, "not a folder, a .py file"),
    "xan": (FULL, 0, ""),                # a file named xan_ch01.py in a folder
    "yan": (FULL, 0, ""),                # the files one folder further down
    "zed": (0, 0, "no file names its chapter"),  # only a file for NO_SUCH_CHAPTER
    "amy": (FULL, 0, ""),                # the solution beside a text file
    "kai": (0, 0, ""),                   # the untouched stub notebook
}
PLANTED = {"no-scale": 4, "softmax-over-queries": 2, "x-times-w": 2, "mask-inverted": 1}


def make_class(root: Path) -> Path:
    """Thirty entries, one per student, as ``EXPECTED`` describes them."""
    root.mkdir()
    write(root / "ada" / PY, SOLUTION)
    write(root / "ben" / PY, STUB)
    for student, bug in [("cy", "no-scale"), ("dee", "no-scale"), ("eli", "no-scale"),
                         ("fay", "softmax-over-queries"), ("gus", "softmax-over-queries"),
                         ("hal", "x-times-w"), ("ian", "x-times-w"), ("jay", "mask-inverted")]:
        write(root / student / PY, with_bug(bug))
    zip_of(root / "ivy.zip", {f"ivy/{PY}": SOLUTION, "__MACOSX/ivy/._x": b"\0"})
    zip_of(root / "jo.zip", {NB: notebook(SOLUTION)})
    write(root / "kim_ch01.py", SOLUTION)
    write(root / "kim_ch02.py", CH02_SOLUTION)
    write(root / "lea_ch01_self_attention.ipynb", notebook(with_bug("no-scale")))
    write(root / "max" / PY, STUB, age=60)
    write(root / "max" / NB, notebook(SOLUTION))
    write(root / "ned" / NB, notebook(SOLUTION), age=60)
    write(root / "ned" / PY, STUB)
    write(root / "ola" / PY, SOLUTION)
    write(root / "ola" / CH02.file_name, CH02_SOLUTION)
    (root / "pat").mkdir()
    write(root / "quinn.zip", b"PK\x03\x04 this zip was cut short")
    zip_of(root / "rae.zip", {PY: SOLUTION, "../escaped.py": "print('out')"})
    zip_of(root / "sam.zip", {PY: SOLUTION}, links={"secret.py": "/etc/passwd"})
    write(root / "tia_ch01.ipynb", '{"cells": [')
    write(root / "uma_ch01.py", b"def softmax(x):\n    return \xff\xfe\n")
    write(root / "vic.py", SOLUTION)
    write(root / "wes.txt", "my answers are in my head")
    write(root / "xan" / "xan_ch01.py", SOLUTION)
    write(root / "yan" / "exercises" / PY, SOLUTION)
    write(root / "zed" / f"{NO_SUCH_CHAPTER}_extra.py", SOLUTION)
    write(root / "amy" / PY, SOLUTION)
    write(root / "amy" / "notes.txt", "done!")
    write(root / "kai" / NB, (COURSE_ROOT / "exercises" / NB).read_text(encoding="utf-8"))
    write(root / ".DS_Store", b"\0\0")  # not a student
    assert len(list_entries(root)) == len(EXPECTED)
    return root


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    return {row["student"]: row for row in csv.DictReader(io.StringIO(path.read_text(encoding="utf-8")))}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """The class, graded once: the run, its CSV and its out folder."""
    root = tmp_path_factory.mktemp("batch")
    submissions = make_class(root / "submissions")
    out = root / "submissions-grades"  # the default: beside the submissions, named after them
    done = mha_course("batch", str(submissions), "--jobs", "2", "--seed", "11")
    assert done.returncode == 0, done.stdout + done.stderr
    return done, read_csv(out / "grades.csv"), out, submissions


def test_every_student_gets_the_right_scores(graded_class):
    _, rows, _, _ = graded_class
    assert set(rows) == set(EXPECTED)
    for student, (ch01, ch02, _) in EXPECTED.items():
        row = rows[student]
        got = sum(int(row[f"ch01/{exercise.name}"]) for exercise in CH01.exercises)
        assert got == ch01, f"{student}: ch01 {got}, expected {ch01}"
        assert sum(int(row[f"ch02/{exercise.name}"]) for exercise in CH02.exercises) == ch02
        assert int(row["total"]) == ch01 + ch02  # chapters not submitted score 0


def test_the_csv_has_a_column_per_exercise_then_total_and_note(graded_class):
    _, _, out, _ = graded_class
    header = next(csv.reader(io.StringIO((out / "grades.csv").read_text(encoding="utf-8"))))
    exercises = [f"{chapter.id}/{exercise.name}" for chapter in CHAPTERS for exercise in chapter.exercises]
    assert header == ["student", *exercises, "total", "note"]


def test_each_planted_bug_costs_its_own_exercise(graded_class):
    _, rows, _, _ = graded_class
    assert rows["hal"]["ch01/self_attention"] == "0" and rows["hal"]["ch01/scaled_dot_product_attention"] == "4"
    assert rows["cy"]["ch01/scaled_dot_product_attention"] == "0" and rows["cy"]["ch01/softmax"] == "2"


def test_broken_submissions_get_a_row_with_the_reason(graded_class):
    done, rows, out, _ = graded_class
    for student, (_, _, note) in EXPECTED.items():
        if note:
            assert note in rows[student]["note"], rows[student]["note"]
        else:
            assert rows[student]["note"] == "", f"{student}: {rows[student]['note']}"
    assert "Traceback" not in done.stdout + done.stderr
    assert not (out.parent / "escaped.py").exists() and not (out.parent / "submissions" / "escaped.py").exists()


def test_each_student_has_a_gradescope_results_json(graded_class):
    _, rows, out, _ = graded_class
    for student, row in rows.items():
        results = json.loads((out / "results" / f"{student}.json").read_text(encoding="utf-8"))
        assert results["score"] == int(row["total"])
        assert results["max_score"] == COURSE_POINTS
        assert len(results["tests"]) == sum(len(chapter.exercises) for chapter in CHAPTERS)
        for test in results["tests"]:
            assert set(test) >= {"name", "score", "max_score", "status", "output", "visibility"}
    cy = json.loads((out / "results" / "cy.json").read_text(encoding="utf-8"))
    assert "not multiplied by 1/sqrt(d_k)" in "\n".join(test["output"] for test in cy["tests"])
    pat = json.loads((out / "results" / "pat.json").read_text(encoding="utf-8"))
    assert "the submission is empty" in pat["output"]


def test_each_results_json_names_the_file_graded_and_why(graded_class):
    _, _, out, _ = graded_class

    def results(student: str) -> dict:
        return json.loads((out / "results" / f"{student}.json").read_text(encoding="utf-8"))

    # ned worked in the notebook; the untouched .py saved after it is not graded.
    assert f"ch01: graded {NB} (it has more written than {PY})" in results("ned")["output"]
    assert results("ned")["extra_data"] == {"seed": 11, "files": {"ch01": NB}}
    assert f"ch01: graded {NB} (it has more written than {PY})" in results("max")["output"]
    assert f"ch01: graded exercises/{PY}" in results("yan")["output"]
    assert "ch01: graded xan_ch01.py" in results("xan")["output"]  # as named inside the submission
    assert "ch01: graded kim_ch01.py" in results("kim")["output"]  # a loose file: its own name
    assert results("kim")["extra_data"]["files"] == {"ch01": "kim_ch01.py", "ch02": "kim_ch02.py"}
    assert f"ch01: graded ivy/{PY}" in results("ivy")["output"]  # inside the zip
    assert results("pat")["extra_data"] == {"seed": None, "files": {}}


def test_chapters_not_submitted_are_zero_with_the_reason(graded_class):
    _, _, out, _ = graded_class
    ada = json.loads((out / "results" / "ada.json").read_text(encoding="utf-8"))
    ch02 = [test for test in ada["tests"] if test["name"].startswith("ch02 ")]
    assert len(ch02) == len(CH02.exercises)
    assert all(test["score"] == 0 and test["status"] == "failed" for test in ch02)
    # The words the Gradescope autograder uses for a chapter with no file.
    assert {test["output"] for test in ch02} == {
        f"no file for ch02 in the submission (expected {CH02.module}.py or {CH02.module}.ipynb)"}
    tia = json.loads((out / "results" / "tia.json").read_text(encoding="utf-8"))
    assert all(test["output"].startswith("not graded: ") for test in tia["tests"])


def test_the_summary_names_the_planted_bugs_with_their_counts(graded_class):
    done, _, _, _ = graded_class
    for name, students in PLANTED.items():
        assert re.search(rf"^\s*{students}\s+ch01 \w+: {name}\s*$", done.stdout, re.MULTILINE), name
    # Most frequent first.
    assert done.stdout.index(": no-scale") < done.stdout.index(": softmax-over-queries")
    assert done.stdout.index(": x-times-w") < done.stdout.index(": mask-inverted")


def test_the_summary_gives_each_exercises_pass_rate(graded_class):
    done, _, _, _ = graded_class
    # 21 students had chapter 1 graded; 10 passed self_attention (not the 2
    # stubs, the 8 planted bugs, hal's and ian's included).
    assert re.search(r"^\s*self_attention\s+2\s+21\s+10\s+48%", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^\s*padding_mask\s+1\s+2\s+2\s+100%", done.stdout, re.MULTILINE)
    assert "ch03" not in done.stdout.split("most frequent known bugs")[0]  # nobody submitted it
    assert "30 graded, 0 unchanged" in done.stdout


def test_a_rerun_grades_only_what_changed(graded_class):
    _, first, out, submissions = graded_class
    again = mha_course("batch", str(submissions), "--out", str(out), "--seed", "11")
    assert again.returncode == 0, again.stderr
    assert "0 graded, 30 unchanged" in again.stdout, again.stdout  # (unless a check was edited meanwhile)
    # However the line wraps: the folder's name, as long as the temporary folder's, comes before it.
    assert "nothing graded again: results kept, graded with seed 11" in " ".join(again.stdout.split())
    assert read_csv(out / "grades.csv") == first  # rows kept as they were
    assert "no-scale" in again.stdout  # the summary still covers the whole class

    write(submissions / "ben" / PY, SOLUTION)
    changed = mha_course("batch", str(submissions), "--out", str(out), "--seed", "11")
    assert "1 graded, 29 unchanged" in changed.stdout
    rows = read_csv(out / "grades.csv")
    assert rows["ben"]["total"] == str(FULL)
    assert {student: row for student, row in rows.items() if student != "ben"} == \
        {student: row for student, row in first.items() if student != "ben"}
    assert json.loads((out / "results" / "ben.json").read_text(encoding="utf-8"))["score"] == FULL


def test_force_grades_everyone_again(tmp_path):
    submissions, out = tmp_path / "class", tmp_path / "grades"
    write(submissions / "ada" / PY, SOLUTION)
    write(submissions / "bo_ch01.py", with_bug("no-scale"))
    first = batch.run_batch(submissions, out, batch.GradingOptions(seed=3), jobs=2)
    assert first.graded_now == {"ada", "bo"}
    forced = batch.run_batch(submissions, out, batch.GradingOptions(seed=3), jobs=2, force=True)
    assert forced.graded_now == {"ada", "bo"}
    assert [row.total for row in forced.grades] == [row.total for row in first.grades] == [FULL, 5]
    assert forced.grades[1].bugs == [("ch01", "scaled_dot_product_attention", "no-scale")]


def test_a_rerun_that_grades_nobody_names_the_seed_the_kept_results_had(tmp_path):
    submissions, out = tmp_path / "class", tmp_path / "grades"
    write(submissions / "ada" / PY, SOLUTION)
    batch.run_batch(submissions, out, batch.GradingOptions(seed=3))
    again = batch.run_batch(submissions, out, batch.GradingOptions(seed=5))  # a fresh seed, nothing changed
    assert again.graded_now == set() and again.grades[0].seed == 3
    summary = io.StringIO()
    batch.print_summary(again, Console(file=summary, width=1000))  # one line per line
    assert "(nothing graded again: results kept, graded with seed 3)" in summary.getvalue()
    assert "seed 5" not in summary.getvalue()

    write(submissions / "bo_ch01.py", SOLUTION)
    mixed = batch.run_batch(submissions, out, batch.GradingOptions(seed=7))
    assert [row.seed for row in mixed.grades] == [3, 7]
    assert batch.seeds_used(mixed) == "seed 7; the results kept were graded with seed 3"


# -- the out folder: one class's grades -------------------------------------------------


def files_of(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def unreadable_class(folder: Path, *students: str) -> Path:
    """A class whose files are not UTF-8: each student gets a row with a
    note, and no check runs (these tests are about where the rows go)."""
    for student in students:
        write(folder / f"{student}_ch01.py", b"\xff\xfe")
    return folder


def test_two_classes_of_one_folder_keep_their_grades_apart(tmp_path):
    for name, student in (("class-a", "ada"), ("class-b", "bo")):
        done = mha_course("batch", str(unreadable_class(tmp_path / name, student)), "--seed", "1")
        assert done.returncode == 0, done.stdout + done.stderr
    for name, student in (("class-a", "ada"), ("class-b", "bo")):
        out = tmp_path / f"{name}-grades"
        assert set(read_csv(out / "grades.csv")) == {student}
        assert sorted(path.name for path in (out / "results").iterdir()) == [f"{student}.json"]


def test_an_out_folder_of_another_class_is_refused_and_left_as_it_was(tmp_path):
    out = tmp_path / "shared"
    first = mha_course("batch", str(unreadable_class(tmp_path / "class-a", "ada")), "--out", str(out))
    assert first.returncode == 0, first.stdout + first.stderr
    kept = files_of(out)
    done = mha_course("batch", str(unreadable_class(tmp_path / "class-b", "bo")), "--out", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "holds the grades of another class" in done.stderr and str(tmp_path / "class-a") in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert files_of(out) == kept


def test_an_out_folder_holding_grades_no_batch_recorded_is_refused(tmp_path):
    out = tmp_path / "mine"
    write(out / "grades.csv", "student,total\nada,99\n")  # a gradebook export, say
    done = mha_course("batch", str(unreadable_class(tmp_path / "class", "ada")), "--out", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "grades.csv" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert files_of(out) == {"grades.csv": b"student,total\nada,99\n"}


def test_an_out_folder_of_other_chapters_is_refused_and_left_as_it_was(tmp_path):
    submissions = unreadable_class(tmp_path / "class", "ada")
    out = tmp_path / "week1"
    first = mha_course("batch", str(submissions), "--chapter", "ch01", "--out", str(out))
    assert first.returncode == 0, first.stdout + first.stderr
    kept = files_of(out)
    done = mha_course("batch", str(submissions), "-c", "ch01", "-c", "ch04", "--out", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "holds this class's grades of ch01, not of ch01, ch04" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert files_of(out) == kept


# -- a batch of some chapters ------------------------------------------------------------


@pytest.mark.usefixtures("checks_pass")  # which files are graded, not how: no check runs
def test_a_batch_of_some_chapters_grades_those_only(tmp_path):
    ch04 = find_chapter("ch04")
    submissions = tmp_path / "class"
    write(submissions / "ada" / PY, SOLUTION)
    write(submissions / "ada" / CH02.file_name, CH02_SOLUTION)  # not due this week
    write(submissions / "bo_ch02.py", CH02_SOLUTION)  # nothing due this week
    write(submissions / "cy_ch04.py", "x = 1\n")
    chapters = (CH01, ch04)
    out = batch_state.default_out(submissions, chapters)
    assert out == tmp_path / "class-grades-ch01-ch04"  # beside the whole course's class-grades/
    options = batch.GradingOptions(seed=3, chapters=chapters)
    result = batch.run_batch(submissions, out, options)

    assert {row.student: row.graded for row in result.grades} == {"ada": ["ch01"], "bo": [], "cy": ["ch04"]}
    header = next(csv.reader(io.StringIO((out / "grades.csv").read_text(encoding="utf-8"))))
    assert header == ["student", *(f"{chapter.id}/{exercise.name}" for chapter in chapters
                                   for exercise in chapter.exercises), "total", "note"]
    rows = read_csv(out / "grades.csv")
    assert (rows["ada"]["total"], rows["cy"]["total"], rows["bo"]["total"]) == (str(CH01.points), str(ch04.points), "0")
    assert rows["bo"]["note"] == "no file for ch01 or ch04; found only other chapters' files: bo_ch02.py"
    ada = json.loads((out / "results" / "ada.json").read_text(encoding="utf-8"))
    assert ada["max_score"] == CH01.points + ch04.points
    assert {test["name"].split()[0] for test in ada["tests"]} == {"ch01", "ch04"}
    summary = io.StringIO()
    batch.print_summary(result, Console(file=summary, width=1000))
    assert f"/ {CH01.points + ch04.points} points (ch01, ch04)" in summary.getvalue()
    # A re-run of the same chapters keeps every row.
    assert batch.run_batch(submissions, out, options).graded_now == set()


def test_rows_of_other_chapters_are_never_read_back(tmp_path):
    row = batch_state.StudentGrade("ada", "digest", {"ch01/softmax": 2}, ["ch01"])
    week1 = batch_state.Owner.of(tmp_path, (CH01,))
    batch_state.save_state(tmp_path, "checks", week1, {"ada": row})
    assert batch_state.load_state(tmp_path, "checks", week1) == ({"ada": row}, False)
    week2 = batch_state.Owner.of(tmp_path, (CH01, find_chapter("ch04")))
    assert batch_state.load_state(tmp_path, "checks", week2) == ({}, False)
    with pytest.raises(batch_state.OutFolderTaken, match="grades of ch01, not of ch01, ch04"):
        batch_state.claim(tmp_path, week2)


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "nowhere", "no such directory"),
    (lambda tmp: write(tmp / "one.py", SOLUTION), "is not a folder"),
    (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "holds no submissions"),
], ids=["missing", "a-file", "empty"])
def test_usage_errors_are_one_line_and_exit_2(tmp_path, make, message):
    done = mha_course("batch", str(make(tmp_path)))
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr + done.stdout


def test_help_states_the_rules():
    done = mha_course("batch", "--help")
    assert done.returncode == 0
    for option in ("--out", "--chapter", "--jobs", "--force", "--timeout", "--seed"):
        assert option in done.stdout
    assert "score 0" in done.stdout and "SUBMISSIONS-grades/ beside SUBMISSIONS" in done.stdout


def test_help_at_80_columns_names_the_argument_as_the_text_does():
    done = mha_course("batch", "--help", columns=80)
    assert done.returncode == 0, done.stderr
    assert "Usage: mha-course batch [OPTIONS] SUBMISSIONS" in done.stdout
    assert "{" not in done.stdout
    assert max(map(len, done.stdout.splitlines())) <= 80


# -- the parts, in this process (no grading) -------------------------------------------


def test_a_chapter_the_course_lacks_is_a_reason(tmp_path):
    with pytest.raises(Unusable, match=f"{NO_SUCH_CHAPTER}.*does not have"):
        class_folder.submission_targets((write(tmp_path / f"eve_{NO_SUCH_CHAPTER}.py", SOLUTION),), tmp_path)


def test_students_are_named_by_their_entries(tmp_path):
    write(tmp_path / "alice" / PY, SOLUTION)
    zip_of(tmp_path / "alice.zip", {PY: SOLUTION})
    write(tmp_path / "bob_ch01.py", SOLUTION)
    zip_of(tmp_path / "carol.zip", {PY: SOLUTION})
    write(tmp_path / "__MACOSX" / "x", "")
    entries = list_entries(tmp_path)
    # Two entries for one id keep their whole names, so neither overwrites the other.
    assert [entry.student for entry in entries] == ["alice", "alice.zip", "bob", "carol"]


def test_a_students_loose_files_are_one_entry_named_without_the_chapter(tmp_path):
    ch04 = find_chapter("ch04")
    write(tmp_path / "bob_ch01.py", SOLUTION)
    write(tmp_path / f"bob_{ch04.id}.py", "x = 1\n")
    write(tmp_path / "lea_ch01_self_attention.ipynb", notebook(SOLUTION))
    bob, lea = list_entries(tmp_path)
    assert (bob.student, lea.student) == ("bob", "lea")
    assert bob.paths == (tmp_path / "bob_ch01.py", tmp_path / "bob_ch04.py")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    targets, found = class_folder.submission_targets(bob.paths, scratch)
    assert [chapter.id for chapter, _ in targets] == ["ch01", "ch04"]
    assert found.sources() == {"ch01": "bob_ch01.py", "ch04": "bob_ch04.py"}  # as the class folder names them


def test_files_in_folders_of_the_folder_are_found(tmp_path):
    write(tmp_path / "alice" / "hw1" / "exercises" / PY, SOLUTION)
    assert class_folder.chapters_of(tmp_path / "alice").chosen == {"ch01": tmp_path / "alice" / "hw1" / "exercises" / PY}


def test_an_entry_hash_changes_with_its_content_only(tmp_path):
    path = write(tmp_path / "alice" / PY, SOLUTION)
    first, _ = class_folder.entry_digest((tmp_path / "alice",))
    write(tmp_path / "alice" / "notes.txt", "not graded, not hashed")
    assert class_folder.entry_digest((tmp_path / "alice",))[0] == first
    path.write_text(STUB)
    assert class_folder.entry_digest((tmp_path / "alice",))[0] != first


@pytest.mark.parametrize("members, links, message", [
    ({"../up.py": "x"}, None, "outside its folder"),
    ({"/etc/cron.d/x.py": "x"}, None, "outside its folder"),
    ({"ok/../../up.py": "x"}, None, "outside its folder"),
    ({"C:\\windows\\x.py": "x"}, None, "outside its folder"),
    ({PY: SOLUTION}, {"link.py": "../../elsewhere"}, "symbolic link"),
], ids=["dot-dot", "absolute", "nested-dot-dot", "drive", "symlink"])
def test_a_zip_that_would_write_outside_is_refused_whole(tmp_path, members, links, message):
    archive = zip_of(tmp_path / "bad.zip", members, links)
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(Unusable, match=message):
        extract_zip(archive, into)
    assert list(into.iterdir()) == [] and sorted(path.name for path in tmp_path.iterdir()) == ["bad.zip", "into"]


def test_a_zip_larger_than_the_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(class_folder, "MAX_UNPACKED_BYTES", 1000)
    archive = zip_of(tmp_path / "big.zip", {PY: "#" * 5000})
    with pytest.raises(Unusable, match="unpacks to more than"):
        extract_zip(archive, tmp_path)


def test_changed_checks_make_the_last_runs_rows_void(tmp_path):
    row = batch_state.StudentGrade("ada", "digest", {"ch01/softmax": 2}, ["ch01"], bugs=[("ch01", "softmax", "x")])
    owner = batch_state.Owner.of(tmp_path, CHAPTERS)
    batch_state.save_state(tmp_path, "checks-v1", owner, {"ada": row})
    assert batch_state.load_state(tmp_path, "checks-v1", owner) == ({"ada": row}, False)
    assert batch_state.load_state(tmp_path, "checks-v2", owner) == ({}, True)
    (tmp_path / batch_state.STATE_FILE).write_text("{not json")
    assert batch_state.load_state(tmp_path, "checks-v1", owner) == ({}, False)


def test_a_zip_keeps_when_each_file_was_saved(tmp_path):
    archive = tmp_path / "times.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr(zipfile.ZipInfo(PY, date_time=(2024, 1, 1, 10, 0, 0)), STUB)
        bundle.writestr(zipfile.ZipInfo(NB, date_time=(2024, 1, 2, 10, 0, 0)), notebook(SOLUTION))
    into = tmp_path / "into"
    into.mkdir()
    extract_zip(archive, into)
    assert class_folder.chapters_of(into).chosen == {"ch01": into / NB}  # the notebook was saved last
