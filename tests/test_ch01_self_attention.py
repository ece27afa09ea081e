"""Chapter 1's checks where the whole-course tests (test_course.py,
test_known_bugs.py) do not look: what a property check says of weights
that hold NaN."""

import torch

from conftest import SOLUTION, Draw, result_of
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


# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py); a class's args
    are ``(init args, call args, call kwargs)``."""
    q, k, v = draw.randn(2, 5, 8), draw.randn(2, 7, 8), draw.randn(2, 7, 4)
    empty_row = draw.mask(5, 7)
    empty_row[2] = False  # a query with no key: zero weights, zero output
    additive = torch.zeros(5, 7).masked_fill(~draw.mask(5, 7), float("-inf"))
    x = draw.randn(2, 5, 6)
    return [
        ("softmax", (draw.randn(3, 5) * 3,), {"dim": 0}),
        ("softmax", (draw.randn(2, 3, 4) * 3,), {}),
        ("softmax", (draw.randn(4, 6, dtype=torch.float64),), {"dim": -1}),
        ("scaled_dot_product_attention", (q, k, v), {}),
        ("scaled_dot_product_attention", (q, k, v), {"mask": empty_row, "scale": 0.5}),
        ("scaled_dot_product_attention", (q, k, v), {"mask": additive}),
        ("self_attention", (x, draw.weights(4, 6), draw.weights(4, 6), draw.weights(3, 6)),
         {"mask": draw.mask(5, 5)}),
        ("softmax_numpy", (draw.randn(3, 5).numpy(),), {"axis": 0}),
        ("softmax_numpy", (draw.randn(2, 6, dtype=torch.float64).numpy(),), {}),
        ("scaled_dot_product_attention_numpy", (q.numpy(), k.numpy(), v.numpy()),
         {"mask": draw.mask(5, 7).numpy()}),
    ]


# The known bug tests/test_release.py makes in the edition and in this tree.
RELEASE_BUG = ("scaled_dot_product_attention", "no-scale")
