"""A grade of the reference solutions and of the untouched stubs, seed fixed,
gives the verdicts it gave when ``snapshots/grades.json`` was written: every
exercise's status and reason, every check's title, outcome, kind, message
and hint, and the Gradescope JSON. A change to the grader's insides changes
none of them.

A deliberate change to what the checks check or say is made by writing the
snapshot again, and reading its diff: ``python tests/test_same_grades.py``.
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


def test_the_solutions_and_the_stubs_grade_as_the_snapshot_says():
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    found = json.loads(json.dumps(grades()))  # tuples as lists, as the snapshot holds them
    for edition in ("solutions", "stubs"):
        for mine, theirs in zip(found[edition]["exercises"], expected[edition]["exercises"], strict=True):
            assert mine == theirs, f"{edition}: {mine['chapter']} {mine['exercise']}"
    assert found == expected


if __name__ == "__main__":
    SNAPSHOT.parent.mkdir(exist_ok=True)
    SNAPSHOT.write_text(json.dumps(grades(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT.relative_to(COURSE_ROOT)}", file=sys.stderr)
