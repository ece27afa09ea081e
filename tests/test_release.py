"""The student edition: ``mha-course release DIR`` and grading inside it.

One edition is built for the suite (conftest's ``edition``, one recorded
seed), shared with tests/test_release_replay.py (verify in the edition's
mode, beside this file) and tests/test_secrets.py; the edition's grader runs
as a student's would, ``python -m grader`` from inside
it with nothing installed (``PYTHONPATH=DIR``), and must give the verdicts,
messages and hints the instructor's tree gives.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EDITION_SEED, chapter_tests
from grader import recorded, recorded_values
from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter, find_chapter, is_student_edition
from grader.cli import main
from grader.compare import matches
from grader.edition import revealing_passages, solution_blocks
from grader.grading import grade
from grader.known_bugs import KNOWN_BUGS, apply_bugs
from grader.report import results_json

SEED = EDITION_SEED  # the students' seed, the one the edition records


def release_bugs(chapter: Chapter) -> list:
    """The known bugs its test file's ``RELEASE_BUG`` names, ``(exercise, bug
    name[, second bug])``: one bug a chapter, in different exercises and kinds of
    output (weights, masks, module outputs, caches, RoPE, grouped heads), each
    with a hint in both trees; in chapter 7 two made together, whose hint is the
    pair's."""
    exercise, *names = chapter_tests(chapter, "RELEASE_BUG").RELEASE_BUG
    where = chapter.bugs().relative_to(COURSE_ROOT)
    assert chapter.bugs().is_file(), f"RELEASE_BUG in tests/test_{chapter.module}.py names bugs of {where}, not written"
    bugs = [bug for name in names for bug in KNOWN_BUGS[chapter.id] if (bug.exercise, bug.name) == (exercise, name)]
    assert len(bugs) == len(names), (f"RELEASE_BUG in tests/test_{chapter.module}.py names {exercise}'s {names}, "
                                     f"not all in {where}")
    return bugs


def _edition_grade(edition: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m grader`` run as a student runs it: inside the edition,
    which comes first on the path, with nothing installed for it."""
    env = {**os.environ, "PYTHONPATH": str(edition)}
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=edition, env=env,
                          capture_output=True, text=True, timeout=240)


def _bug_folder(folder: Path) -> Path:
    """One file a chapter, each the solution with that chapter's ``release_bugs``."""
    folder.mkdir()
    for chapter in CHAPTERS:
        source = chapter.solution().read_text(encoding="utf-8")
        (folder / chapter.file_name).write_text(apply_bugs(source, release_bugs(chapter)), encoding="utf-8")
    return folder


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_every_chapter_names_the_known_bugs_the_release_test_makes(chapter):
    """Read before any edition is built: a chapter whose test file lacks
    RELEASE_BUG, or names a bug its bugs.py lacks, fails here at once."""
    bugs = release_bugs(chapter)
    assert bugs and all(bug.hint for bug in bugs), chapter.id


# -- what the edition holds -------------------------------------------------------------


def test_edition_holds_no_solution_code(edition):
    assert not (edition / "solutions").exists()
    assert not (edition / "tests").exists()
    assert revealing_passages(edition) == []
    for chapter in CHAPTERS:
        assert chapter.stub(edition).is_file()
        assert chapter.notebook(edition).is_file()
        assert (edition / "grader" / "recorded" / f"{chapter.id}.rec").is_file()
        assert chapter.lesson(edition).is_file()


def test_the_search_for_solution_code_finds_it(tmp_path):
    """The check above is not vacuous: a copied solution block is found."""
    block = max(solution_blocks(), key=len)
    (tmp_path / "notes.py").write_text("x = 1\n" + "\n".join(f"    {line}" for line in block) + "\n")
    assert revealing_passages(tmp_path)


def test_edition_keeps_the_hints_not_the_bugs(edition):
    text = find_chapter("ch01").bugs(edition).read_text(encoding="utf-8")
    for bug in KNOWN_BUGS["ch01"]:
        assert repr(bug.hint) in text
        assert repr(bug.old) not in text and repr(bug.new) not in text


def test_edition_readme_is_the_students(edition):
    readme = (edition / "README.md").read_text(encoding="utf-8")
    for instructors in ("solutions/", "tests/", ".ci/run", "## For instructors", "python -m pytest",
                        "[dev]", "mha-course build", "mha-course verify", "mha-course release",
                        "mha-course batch", "mha-course gradescope", "<!-- section"):
        assert instructors not in readme, instructors
    # Set-up: the CPU build of torch before the course, and Jupyter named.
    cpu, install = readme.index("download.pytorch.org/whl/cpu"), readme.index("pip install -e . && mha-course list")
    assert cpu < install
    assert 'pip install -e ".[notebook]"' in readme and "jupyter notebook exercises/" in readme
    # The sections it shares with the course's README, whole.
    course = (COURSE_ROOT / "README.md").read_text(encoding="utf-8")
    for heading in ("## For students: working through a chapter", "## Chapters"):
        start = course.index(heading)
        end = course.find("\n## ", start)
        assert course[start:end if end >= 0 else None].strip() in readme


def test_a_students_lesson_loses_its_known_bug_tags_and_nothing_else():
    from grader.edition import student_lesson

    lesson = ("- **No scale.** Divide by `sqrt(d_k)`.\n"
              "  <!-- known bugs: no-scale -->\n"
              "- **Top-left.** Use the bottom-right corner. <!-- known bugs: top-left,\n"
              "  square-mask -->\n"
              "<!-- a comment of another kind --> stays\n")
    assert student_lesson(lesson) == ("- **No scale.** Divide by `sqrt(d_k)`.\n"
                                      "- **Top-left.** Use the bottom-right corner.\n"
                                      "<!-- a comment of another kind --> stays\n")


def test_edition_lessons_and_notebooks_hold_no_known_bug_names(edition):
    """The catalog's names are for tests/test_lessons.py, not for a student
    who opens a lesson's raw file or a notebook's JSON."""
    import nbformat

    from grader.edition import student_lesson

    for chapter in CHAPTERS:
        course = chapter.lesson().read_text(encoding="utf-8")
        theirs = chapter.lesson(edition).read_text(encoding="utf-8")
        assert "<!-- known bugs:" in course and "known bugs:" not in theirs, chapter.folder
        assert theirs == student_lesson(course)
        mine, notebook = (nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
                          for path in (chapter.notebook(), chapter.notebook(edition)))
        assert "known bugs:" not in chapter.notebook(edition).read_text(encoding="utf-8")
        assert [cell.cell_type for cell in mine.cells] == [cell.cell_type for cell in notebook.cells]
        assert [cell.source for cell in notebook.cells] == [
            student_lesson(cell.source) if cell.cell_type == "markdown" else cell.source for cell in mine.cells]


def test_edition_ships_no_instructors_file(edition):
    """grader/README.md cites tests/ and solutions/, and the build's record
    belongs to a build the edition refuses to run."""
    assert (COURSE_ROOT / "grader" / "README.md").is_file()
    assert not (edition / "grader" / "README.md").exists()
    assert (COURSE_ROOT / "exercises" / ".build-record.json").is_file()
    assert not (edition / "exercises" / ".build-record.json").exists()


def test_edition_tells_a_student_no_instructors_command(edition):
    from grader.cli import INSTRUCTOR_COMMANDS

    named = [f"{path.relative_to(edition)}: mha-course {command}"
             for path in [edition / "README.md", *(edition / "chapters").rglob("*"), *(edition / "exercises").rglob("*")]
             if path.is_file() and path.suffix in (".md", ".py", ".ipynb")
             for command in INSTRUCTOR_COMMANDS if f"mha-course {command}" in path.read_text(encoding="utf-8")]
    assert not named, named


def _commands_in_help(help_text: str) -> list[str]:
    """The commands of typer's "Commands" panel, in order."""
    panel = help_text[help_text.index("Commands"):]
    return re.findall(r"^\W+ ([a-z]+)  ", panel, flags=re.MULTILINE)


def test_both_readmes_name_the_commands_the_editions_help_lists(edition):
    commands = _commands_in_help(_edition_grade(edition, "--help").stdout)
    assert commands and "grade" in commands and "watch" in commands, commands
    readme = (edition / "README.md").read_text(encoding="utf-8")
    assert [command for command in commands if f"mha-course {command}" not in readme] == []
    # The course's README, where it describes the edition's help.
    course = " ".join((COURSE_ROOT / "README.md").read_text(encoding="utf-8").split())
    sentence = re.search(r"its `mha-course --help` lists (.*?) only", course)
    assert sentence is not None
    assert re.findall(r"`([a-z]+)`", sentence.group(1)) == commands


def test_edition_project_has_no_instructors_extras(edition):
    import tomllib

    project = tomllib.loads((edition / "pyproject.toml").read_text(encoding="utf-8"))
    course = tomllib.loads((COURSE_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["optional-dependencies"] == {"notebook": course["project"]["optional-dependencies"]["notebook"]}
    assert project["project"]["dependencies"] == course["project"]["dependencies"]
    assert "pytest" not in project.get("tool", {})
    assert project["tool"]["setuptools"]["package-data"]["grader"] == ["recorded/*"]
    index = json.loads((edition / "grader" / "recorded" / "index.json").read_text(encoding="utf-8"))
    assert SEED in index["seeds"]


def test_edition_help_shows_a_students_commands(edition):
    from grader.cli import INSTRUCTOR_COMMANDS

    shown = _edition_grade(edition, "--help").stdout
    assert " grade " in shown and " list " in shown
    assert not [command for command in INSTRUCTOR_COMMANDS if f" {command} " in shown], shown
    assert "--solutions" not in _edition_grade(edition, "grade", "--help").stdout


@pytest.mark.parametrize("command", ["build", "verify", "release", "batch", "gradescope"])
def test_edition_answers_an_instructors_command_in_one_line(edition, command, tmp_path):
    ran = _edition_grade(edition, command, str(tmp_path / "out"))
    assert ran.returncode == 2 and ran.stdout == ""
    (line,) = ran.stderr.strip().splitlines()
    assert f"mha-course {command} belongs to the instructor's tree" in line
    assert not (tmp_path / "out").exists()


def test_instructor_tree_does_not_replay():
    assert not is_student_edition()
    assert isinstance(recorded.tree_mode(), recorded.Live)
    assert not (COURSE_ROOT / "grader" / "recorded").exists()


def _answer_cases() -> list:
    """``(chapter, exercise, args, kwargs, the reference's answer)`` for the
    sample calls of every function exercise (classes are built, not pasted)."""
    from test_correct_styles import load, sample_calls

    cases = []
    for chapter in CHAPTERS:
        reference = load(chapter.solution(), f"reference_{chapter.module}")
        for seed in (0, 1):
            for name, args, kwargs in sample_calls(chapter, seed):
                if not isinstance(getattr(reference, name), type):
                    cases.append((chapter.id, name, args, kwargs, getattr(reference, name)(*args, **kwargs)))
    return cases


def _scan_for_answers(edition: Path, tmp_path: Path, *extras: Path) -> dict:
    cases, out = tmp_path / "cases.pt", tmp_path / "found.json"
    torch.save(_answer_cases(), cases)
    env = {**os.environ, "PYTHONPATH": str(edition)}
    ran = subprocess.run([sys.executable, str(COURSE_ROOT / "tests" / "answer_scan.py"), str(cases), str(out),
                          *map(str, extras)], cwd=edition, env=env, capture_output=True, text=True, timeout=240)
    assert ran.returncode == 0, ran.stderr
    return json.loads(out.read_text(encoding="utf-8"))


def test_no_function_in_the_edition_checks_answers_an_exercise(edition, tmp_path):
    """Every function defined in the edition's checks, pasted as an exercise
    of its chapter, fails: the oracles that answer exercises are recorded,
    not shipped. Functions that return the reference's answers to the
    sample calls are graded for real; the others cannot pass."""
    from conftest import replace_function

    # A control: the reference's own causal_mask, under a check's kind of name.
    reference = (COURSE_ROOT / "solutions" / "ch04_causal_attention.py").read_text(encoding="utf-8")
    control = tmp_path / "control.py"
    control.write_text("import torch\n\n\n" + _definition(reference, "causal_mask")
                       .replace("def causal_mask(", "def _mask_oracle("), encoding="utf-8")
    found = _scan_for_answers(edition, tmp_path, control)
    # Nearly every helper was called (a few need their enclosing function's names).
    defined = sum(isinstance(node, ast.FunctionDef) and not node.name.startswith("test_")
                  for path in [edition / "grader" / "checks.py",
                               *(edition / "grader" / "chapters").glob("ch*/test_*.py")]
                  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))
    assert found["scanned"] >= 0.8 * defined > 50
    assert any(name.startswith("control.py:_mask_oracle") and exercise == "causal_mask"
               for _, exercise, name, _ in found["answers"])
    passing = []
    for chapter_id, exercise, name, text in found["answers"]:
        if name.startswith("control.py:"):
            continue
        chapter = find_chapter(chapter_id)
        function = name.split(":")[1].split("@")[0]
        pasted = text.replace(f"def {function}(", f"def {exercise}(", 1)
        path = tmp_path / "pasted" / chapter.file_name
        path.parent.mkdir(exist_ok=True)
        source = chapter.solution().read_text(encoding="utf-8")
        path.write_text(replace_function(source, exercise, pasted), encoding="utf-8")
        ran = _edition_grade(edition, "grade", str(path), "--json", "--seed", str(SEED))
        (test,) = [test for test in json.loads(ran.stdout)["tests"] if test["name"].startswith(f"{chapter_id} {exercise}:")]
        if test["score"] == test["max_score"]:
            passing.append(f"{name} passes {exercise}")
    assert not passing, passing


def _definition(source: str, name: str) -> str:
    from grader.known_bugs import function_span

    start, end = function_span(source, name)
    return source[start:end]


# -- grading in the edition -----------------------------------------------------------------


def test_edition_grades_reference_and_bugs_as_the_instructor_tree(edition, tmp_path):
    bugs = _bug_folder(tmp_path / "bugs")
    ran = _edition_grade(edition, "grade", "--dir", str(bugs), "--seed", str(SEED), "--json")
    assert ran.returncode == 1, ran.stderr
    in_edition = json.loads(ran.stdout)
    mine = results_json(grade([(c, bugs / c.file_name) for c in CHAPTERS], seed=SEED))
    # Each exercise: status, score, every failed check with its message and hint.
    assert in_edition["tests"] == mine["tests"]
    assert in_edition["score"] == mine["score"] < mine["max_score"]
    assert sum("hint:" in test["output"] for test in mine["tests"]) >= len(CHAPTERS)
    assert "hint: looks like two mistakes together" in json.dumps(mine["tests"])  # chapter 7's pair

    # The reference, with the seed chosen for us (one of those recorded).
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    for chapter in CHAPTERS:
        (solutions / chapter.file_name).write_bytes(
            chapter.solution().read_bytes())
    ran = _edition_grade(edition, "grade", "--dir", str(solutions))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    total = sum(chapter.points for chapter in CHAPTERS)
    assert f"{total} / {total} points" in ran.stdout
    assert f"seed {SEED}, cpu" in ran.stdout, ran.stdout


def test_edition_refuses_a_seed_it_did_not_record(edition):
    ran = _edition_grade(edition, "grade", "ch01", "--seed", "8")
    assert ran.returncode != 0
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and f"use one of {SEED}, or no --seed" in lines[0]


def test_release_refuses_a_used_folder(tmp_path, capsys):
    (tmp_path / "something").write_text("x")
    with pytest.raises(SystemExit) as exit_:
        main(["release", str(tmp_path)])
    assert exit_.value.code == 2
    assert "not an empty folder" in capsys.readouterr().err


@pytest.mark.parametrize("through_a_link", [False, True], ids=["inside", "through-a-link"])
def test_release_refuses_a_folder_inside_the_course_before_writing(tmp_path, capsys, monkeypatch, through_a_link):
    """``release exercises/x`` would copy the edition into itself: refused in
    one line, before anything is recorded or written, also where the path
    reaches the course through a symbolic link."""
    import grader.edition

    def record(*args):
        raise AssertionError("recorded before refusing the folder")

    monkeypatch.setattr(grader.edition, "_record", record)
    inside = COURSE_ROOT / "exercises" / "edition-inside-the-course"
    if through_a_link:
        (tmp_path / "course").symlink_to(COURSE_ROOT)
        target = tmp_path / "course" / "exercises" / inside.name
    else:
        target = inside
    with pytest.raises(SystemExit) as exit_:
        main(["release", str(target)])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "inside the course" in line
    assert not inside.exists()


# -- replay ---------------------------------------------------------------------------------


def test_a_call_that_was_not_recorded_is_a_grader_error():
    reference = recorded.Replayer.__new__(recorded.Replayer)
    reference._recordings = {"ch01": recorded.Recording()}
    replay = reference.reference(find_chapter("ch01"), "test_ch01_self_attention.py::test_x")
    with pytest.raises(recorded.NotRecorded, match="test_ch01_self_attention.py::test_x"):
        replay.softmax(torch.ones(3), dim=-1)


def test_recorded_answers_come_back_equal_and_fresh():
    chapter = find_chapter("ch01")
    recording = recorded.Recording()
    x = torch.randn(2, 3)
    answer = (torch.softmax(x, -1), np.ones((2, 2)), 3, None, [torch.zeros(1, dtype=torch.bool)])
    recording.answers[recorded_values.digest("ch01", "softmax", (x,), {"dim": -1}, None)] = recorded_values.plain(answer)
    loaded = recorded.Recording.from_bytes(recording.to_bytes())
    replay = recorded.ReplayReference(chapter, "check", loaded)
    first = replay.softmax(x.clone(), dim=-1)
    assert recorded_values.equal(first, answer)
    first[0].zero_()  # a check that changes an answer in place changes no later one
    assert recorded_values.equal(replay.softmax(x, dim=-1), answer)
    with pytest.raises(recorded.NotRecorded):
        replay.softmax(x, dim=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fingerprint_matches_as_compare_does(dtype):
    generator = torch.Generator().manual_seed(0)
    wrong = torch.randn(4, 6, 8, generator=generator, dtype=torch.float64).to(dtype)
    wrong[1, 2, 3] = float("nan")
    wrong[2, 0, 0] = float("-inf")
    fingerprint = recorded_values.Fingerprint.of(wrong)
    shifted = wrong.clone()
    shifted[0] += 0.5  # one row off: a fingerprint sees it
    near = wrong * (1 + 1e-9) if dtype == torch.float64 else wrong * (1 + 1e-6)
    no_nan = wrong.nan_to_num(0.0, neginf=float("-inf"))
    for got in (wrong.clone(), near, shifted, no_nan, wrong.float() if dtype == torch.float64 else wrong.double(),
                wrong[0], wrong.numpy()):
        assert fingerprint.matched_by(got) == matches(got, wrong)
        assert matches(got, fingerprint) == matches(got, wrong)  # compare's hook
    with pytest.raises(TypeError):
        fingerprint[0]


def test_in_the_edition_student_code_reads_no_recording(edition, tmp_path):
    """The recorded answers are the edition's reference: out of a worker's reach."""
    recorded = next(path for path in (edition / "grader" / "recorded").iterdir() if path.is_file())
    solution = (COURSE_ROOT / "solutions" / "ch01_self_attention.py").read_text(encoding="utf-8")
    from conftest import replace_function

    path = tmp_path / "ch01_self_attention.py"
    path.write_text(replace_function(solution, "self_attention", f'''
def self_attention(x, w_q, w_k, w_v, mask=None):
    with open({str(recorded)!r}, "rb") as answers:
        answers.read()
    return x
'''), encoding="utf-8")
    done = _edition_grade(edition, "grade", str(path), "--json", "--seed", str(SEED))
    tests = {test["name"].split(":")[0]: test for test in json.loads(done.stdout)["tests"]}
    assert tests["ch01 self_attention"]["score"] == 0
    assert "PermissionError" in tests["ch01 self_attention"]["output"]
    assert all(test["score"] == test["max_score"] for name, test in tests.items() if name != "ch01 self_attention")


def test_watch_in_the_edition_regrades_a_save_with_recorded_answers(edition, tmp_path):
    """A student's loop in the edition: a table at once, a new one after a
    save, answers replayed from the recordings, Ctrl-C ends it."""
    from test_watch import Watcher, _save

    chapter = find_chapter("ch01")
    work = tmp_path / chapter.file_name
    work.write_bytes(chapter.stub(edition).read_bytes())
    running = Watcher(str(work), "--seed", str(SEED), cwd=edition, env={"PYTHONPATH": str(edition)})
    try:
        assert f"Total: 0 / {chapter.points} points" in running.report()
        _save(work, chapter.solution().read_text(encoding="utf-8"))
        right = running.report()
        assert f"Total: {chapter.points} / {chapter.points} points" in right and f"seed {SEED}" in right, right
        assert running.interrupt()[0] == 130
    finally:
        if running.process.poll() is None:
            os.killpg(running.process.pid, signal.SIGKILL)


@pytest.mark.parametrize("name", [
    "alias-hides-internals", "refusals-replaced-at-import", "numpy-exercise-uses-torch", "execs-the-reference",
    "scores-in-a-subclass", "forks-a-process", "stops-the-fork-server", "writes-200-mib",
])
def test_every_attack_scores_nothing_in_the_edition(edition, tmp_path, name):
    from test_attacks import BY_NAME, grader_untouched, json_keeps_the_others_points

    attack = BY_NAME[name]
    path = tmp_path / f"{find_chapter(attack.chapter).module}.py"
    path.write_text(attack.source(), encoding="utf-8")
    done = _edition_grade(edition, "grade", str(path), "--json", "--seed", str(SEED))
    json_keeps_the_others_points(json.loads(done.stdout)["tests"], attack)
    grader_untouched()
