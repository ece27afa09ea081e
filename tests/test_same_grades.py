"""A grade of the reference solutions and of the untouched stubs, seed fixed,
gives the verdicts it gave when ``snapshots/grades.json`` was written: every
exercise's status and reason, every check's title, outcome, kind, message
and hint, and the Gradescope JSON. A change to the grader's insides changes
none of them.

A deliberate change to what the checks check or say (a new check, a new
exercise, a new chapter) is made by writing the snapshot again, from the
repository's root, and reading its diff: ``python tests/test_same_grades.py``
(``REFRESH``). A failure names each chapter, exercise and check that differs,
and prints that command.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from grader.build import generated_files, write_stubs
from grader.catalog import CHAPTERS, COURSE_ROOT
from grader.grading import GradeReport, grade
from grader.report import results_json

SNAPSHOT = Path(__file__).resolve().parent / "snapshots" / "grades.json"
SEED = 11
REFRESH = "python tests/test_same_grades.py"


def _verdicts(report: GradeReport) -> dict:
    """What a grade found, without its timing."""
    found = results_json(report)
    del found["execution_time"]
    found["exercises"] = [
        {"chapter": result.chapter.id, "exercise": result.exercise.name, "status": result.status,
         "reason": result.reason, "note": result.note,
         "checks": [[check.check, check.outcome, check.kind or "", check.message, check.hint]
                    for check in result.checks]}
        for result in report.exercises
    ]
    return found


def grades() -> dict:
    """The solutions' and the stubs' grades (the stubs as the build writes
    them: exercises/ may hold someone's work)."""
    solutions = grade([(c, c.solution()) for c in CHAPTERS], seed=SEED)
    with tempfile.TemporaryDirectory() as folder:
        stubbed = grade(write_stubs(generated_files(COURSE_ROOT), COURSE_ROOT, Path(folder)), seed=SEED)
    return {"seed": SEED, "solutions": _verdicts(solutions), "stubs": _verdicts(stubbed)}


def _exercises(verdicts: dict) -> list[tuple[str, str]]:
    """``[(chapter id, exercise name), ...]`` of one edition's verdicts, in order."""
    return [(found["chapter"], found["exercise"]) for found in verdicts["exercises"]]


def catalog_differences(graded: list[tuple[str, str]], snapshot: list[tuple[str, str]]) -> list[str]:
    """The chapters and exercises that one list of ``(chapter id, exercise
    name)`` has and the other lacks, one line each; the order, if only it differs."""
    lines = []
    graded_chapters, snapshot_chapters = dict.fromkeys(c for c, _ in graded), dict.fromkeys(c for c, _ in snapshot)
    lines += [f"{c} is in the catalog, not in the snapshot" for c in graded_chapters if c not in snapshot_chapters]
    lines += [f"{c} is in the snapshot, not in the catalog" for c in snapshot_chapters if c not in graded_chapters]
    lines += [f"{c} {e} is in the catalog, not in the snapshot" for c, e in graded
              if c in snapshot_chapters and (c, e) not in snapshot]
    lines += [f"{c} {e} is in the snapshot, not in the catalog" for c, e in snapshot
              if c in graded_chapters and (c, e) not in graded]
    if not lines and graded != snapshot:
        lines.append("the catalog orders its chapters or exercises otherwise than the snapshot")
    return lines


def _exercise_differences(name: str, graded: dict, snapshot: dict) -> list[str]:
    """What differs in one exercise's verdict, each line starting with ``name``."""
    lines = [f"{name}: {field} {graded[field]!r}, the snapshot's {snapshot[field]!r}"
             for field in ("status", "reason", "note") if graded[field] != snapshot[field]]
    now, before = ({check[0]: check for check in verdict["checks"]} for verdict in (graded, snapshot))
    lines += [f"{name}: a new check, {title!r}" for title in now if title not in before]
    lines += [f"{name}: check {title!r} is gone" for title in before if title not in now]
    lines += [f"{name}: check {title!r}: {now[title][1:]}, the snapshot's {before[title][1:]}"
              for title in now if title in before and now[title] != before[title]]
    if not lines and graded["checks"] != snapshot["checks"]:
        lines.append(f"{name}: its checks, in order or number")
    return lines


def verdict_differences(found: dict, expected: dict) -> list[str]:
    """What differs between two grades as ``grades()`` gives them, one line a
    difference, named by edition, chapter, exercise and check."""
    lines = [f"seed {found['seed']}, the snapshot's {expected['seed']}"] if found["seed"] != expected["seed"] else []
    for edition in ("solutions", "stubs"):
        mine, theirs = found[edition], expected[edition]
        missing = catalog_differences(_exercises(mine), _exercises(theirs))
        lines += [f"{edition}: {line}" for line in missing]
        if missing:
            continue
        differing = [line for graded, snapshot in zip(mine["exercises"], theirs["exercises"], strict=True)
                     for line in _exercise_differences(f"{edition}: {graded['chapter']} {graded['exercise']}",
                                                       graded, snapshot)]
        report, snapshot_report = ({key: value for key, value in verdicts.items() if key != "exercises"}
                                   for verdicts in (mine, theirs))
        if not differing and report != snapshot_report:
            differing.append(f"{edition}: the Gradescope JSON (score, tests)")
        lines += differing
    return lines


def _failure(lines: list[str]) -> str:
    return (f"{SNAPSHOT.name} differs:\n  " + "\n  ".join(lines) +
            f"\nIf the change is meant, write the snapshot again and read its diff: {REFRESH}")


def test_the_snapshot_grades_the_catalog_s_chapters_and_exercises():
    """Read before any grade: a chapter or an exercise added to the catalog (or
    taken out) since the snapshot was written is named at once."""
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    catalog = [(chapter.id, exercise.name) for chapter in CHAPTERS for exercise in chapter.exercises]
    lines = [f"{edition}: {line}" for edition in ("solutions", "stubs")
             for line in catalog_differences(catalog, _exercises(expected[edition]))]
    assert not lines, _failure(lines)


def test_a_chapter_the_snapshot_lacks_is_named_with_the_command_that_refreshes_it():
    # A catalog of its own: the test holds whatever chapters the course has.
    catalog = [("ch01", "softmax"), ("ch01", "attention"), ("ch02", "mask"), ("ch03", "heads"), ("ch03", "merge")]
    without_ch03 = catalog[:3]
    assert catalog_differences(catalog, without_ch03) == ["ch03 is in the catalog, not in the snapshot"]
    assert catalog_differences(without_ch03, catalog) == ["ch03 is in the snapshot, not in the catalog"]
    assert catalog_differences(catalog, catalog[:-1]) == ["ch03 merge is in the catalog, not in the snapshot"]
    assert catalog_differences(catalog[::-1], catalog) == [
        "the catalog orders its chapters or exercises otherwise than the snapshot"]
    assert _failure(["x"]).endswith(f": {REFRESH}")


def test_a_changed_check_is_named_by_its_chapter_exercise_and_title():
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    found = json.loads(json.dumps(expected))
    # The first chapter's last exercise: its chapter keeps others when it goes.
    exercises = found["stubs"]["exercises"]
    index = max(i for i, found_exercise in enumerate(exercises) if found_exercise["chapter"] == exercises[0]["chapter"])
    assert index > 0, "the test needs a first chapter of two exercises or more"
    exercise = exercises[index]
    exercise["checks"][0][3] = "a message that changed"
    (line,) = verdict_differences(found, expected)
    assert line.startswith(f"stubs: {exercise['chapter']} {exercise['exercise']}: check {exercise['checks'][0][0]!r}")
    found["solutions"]["exercises"].pop(index)
    assert verdict_differences(found, expected)[0] == (
        f"solutions: {exercise['chapter']} {exercise['exercise']} is in the snapshot, not in the catalog")


def test_the_solutions_and_the_stubs_grade_as_the_snapshot_says():
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    found = json.loads(json.dumps(grades()))  # tuples as lists, as the snapshot holds them
    lines = verdict_differences(found, expected)
    assert not lines, _failure(lines)
    assert found == expected, _failure(["the grades, in a part no line above names"])


if __name__ == "__main__":
    SNAPSHOT.parent.mkdir(exist_ok=True)
    SNAPSHOT.write_text(json.dumps(grades(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT.relative_to(COURSE_ROOT)}", file=sys.stderr)
