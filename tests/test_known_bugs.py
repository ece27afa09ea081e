"""Every known bug is caught by the checks, and the feedback names it."""

import pytest

from conftest import CH01, SOLUTION, result_of, statuses
from grader.known_bugs import KNOWN_BUGS, apply_bug

BUGS = KNOWN_BUGS["ch01"]


def affected_by(exercise: str) -> set[str]:
    """The exercise and every exercise that builds on it, directly or not."""
    found = {exercise}
    changed = True
    while changed:
        changed = False
        for other in CH01.exercises:
            if other.name not in found and found.intersection(other.uses):
                found.add(other.name)
                changed = True
    return found


@pytest.mark.parametrize("bug", BUGS, ids=[f"{bug.exercise}/{bug.name}" for bug in BUGS])
def test_known_bug_fails_its_exercise_and_is_named(grade_source, bug):
    report = grade_source(apply_bug(SOLUTION, bug))
    result = result_of(report, bug.exercise)
    assert result.status == "failed"
    assert bug.hint in [check.hint for check in result.failed_checks]
    for name, status in statuses(report).items():
        if name not in affected_by(bug.exercise):
            assert status == "passed", f"{name} should not be affected by {bug.name}"


def test_the_bugs_the_course_promises_to_catch_are_in_the_catalog():
    names = {bug.name for bug in BUGS}
    assert {"no-scale", "softmax-over-queries", "no-max-shift", "mask-inverted",
            "weights-transposed"} <= names


def test_every_exercise_has_known_bugs():
    assert {bug.exercise for bug in BUGS} == {exercise.name for exercise in CH01.exercises}


def test_a_wrong_answer_like_no_known_bug_gets_no_hint(grade_source):
    source = SOLUTION.replace("return weights @ v, weights  # (..., L, d_v), (..., L, S)",
                              "return weights @ v * 2, weights")
    report = grade_source(source)
    result = result_of(report, "scaled_dot_product_attention")
    assert result.status == "failed"
    assert all(check.hint is None for check in result.failed_checks)


def test_a_bug_edit_must_match_the_solution_exactly():
    with pytest.raises(ValueError, match="occurs 0 times"):
        apply_bug(SOLUTION, BUGS[0].__class__("softmax", "x", "hint", "no such line", "y"))
