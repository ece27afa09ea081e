"""Chapter 1's checks where the whole-course tests (test_course.py,
test_known_bugs.py) do not look: what a property check says of weights
that hold NaN."""

from conftest import SOLUTION, result_of
from grader.known_bugs import KNOWN_BUGS, apply_bug


def _with_bugs(source: str, *names: str) -> str:
    for name in names:
        source = apply_bug(source, next(bug for bug in KNOWN_BUGS["ch01"] if bug.name == name))
    return source


def test_weights_that_hold_nan_are_said_to_hold_nan_not_negative_entries(grade_source):
    # An inverted mask, and a query with no key left to softmax's NaN. Seed 6
    # gives the property check's mask a row that keeps every key, which the
    # inverted mask then hides: NaN, which `>= 0` reads as false.
    source = _with_bugs(SOLUTION, "mask-inverted", "nan-for-empty-rows")
    report = grade_source(source, seed=6, only={"scaled_dot_product_attention"})
    checks = result_of(report, "scaled_dot_product_attention").failed_checks
    (check,) = [check for check in checks if check.check.startswith("each query's weights are >= 0")]
    assert "NaN at [" in check.message and "every key of that query masked" in check.message, check.message
    assert "negative" not in check.message
