"""Hidden checks for chapter 13: sliding-window attention.

The mask is compared with the window's definition taken pair by pair
(oracles.py) and with the reference, for windows of one position, of a few
and wider than the sequence, one token, and positions with gaps. On a
mismatch, known wrong masks are made from the same inputs and a matching
one's hint goes with the failure.
"""

import pytest
import torch

from grader.checks import Oracles, case_ids, exercise, portability_check, portable, run
from grader.compare import expect_close

# The window's definition, pair by pair (oracles.py).
oracles = Oracles("ch13")

# (id, positions, window)
MASK_CASES = [
    ("T6-window3", list(range(6)), 3),
    ("T6-window1", list(range(6)), 1),
    ("T4-window10", list(range(4)), 10),
    ("gaps-window2", [0, 1, 2, 5, 6, 9], 2),
    ("T1-window1", [0], 1),
]


@exercise("sliding_window_mask")
@pytest.mark.parametrize("case", MASK_CASES, ids=case_ids(MASK_CASES))
def test_sliding_window_mask_is_the_window(submission, bugs, case):
    """is True exactly where 0 <= positions[i] - positions[j] < window (windows of 1, 3 and more than T; gaps)"""
    _, positions, window = case
    positions = torch.tensor(positions)  # (T,)
    got, call = run(submission, "sliding_window_mask", positions, window)
    expect_close(got, oracles.sliding_window_mask(positions, window), call,
                 lookalikes=bugs.sliding_window_mask(positions, window), reference="the window's definition")


@exercise("sliding_window_mask")
def test_sliding_window_mask_matches_reference(submission, reference, bugs, inputs):
    """matches the reference on increasing positions with random gaps"""
    positions = torch.cumsum(1 + (inputs.randn(9) > 0).long(), dim=0)  # (T,) = (9,), steps of 1 or 2
    got, call = run(submission, "sliding_window_mask", positions, 4)
    expect_close(got, reference.sliding_window_mask(positions, 4), call,
                 lookalikes=bugs.sliding_window_mask(positions, 4))


# -- every exercise -----------------------------------------------------------------------

test_would_run_on_a_gpu = portability_check([
    portable("sliding_window_mask", lambda inputs: ((torch.arange(6), 3), {})),
])
