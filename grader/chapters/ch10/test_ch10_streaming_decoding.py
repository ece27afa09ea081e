"""Hidden checks for chapter 10: Bounded-memory decoding: sliding windows, a rolling cache, attention sinks.

TODO: what the checks try, in a paragraph: the cases, the oracles they
compare with, what a failure says. Each check's docstring is the sentence a
student reads.
"""

import pytest
import torch

from grader.checks import Oracles, case_ids, exercise, portability_check, portable, run
from grader.compare import expect_close

# TODO: what the oracles compute (oracles.py).
oracles = Oracles("ch10")


# -- sliding_window_mask -------------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
SLIDING_WINDOW_MASK_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("sliding_window_mask")
@pytest.mark.parametrize("case", SLIDING_WINDOW_MASK_CASES, ids=case_ids(SLIDING_WINDOW_MASK_CASES))
def test_sliding_window_mask_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "sliding_window_mask", x)
    expect_close(got, oracles.sliding_window_mask(x), call, lookalikes=bugs.sliding_window_mask(x),
                 reference="TODO: the oracle's name")


@exercise("sliding_window_mask")
def test_sliding_window_mask_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "sliding_window_mask", x)
    expect_close(got, reference.sliding_window_mask(x), call, lookalikes=bugs.sliding_window_mask(x))


# -- rolling_cache_append ------------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
ROLLING_CACHE_APPEND_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("rolling_cache_append")
@pytest.mark.parametrize("case", ROLLING_CACHE_APPEND_CASES, ids=case_ids(ROLLING_CACHE_APPEND_CASES))
def test_rolling_cache_append_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "rolling_cache_append", x)
    expect_close(got, oracles.rolling_cache_append(x), call, lookalikes=bugs.rolling_cache_append(x),
                 reference="TODO: the oracle's name")


@exercise("rolling_cache_append")
def test_rolling_cache_append_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "rolling_cache_append", x)
    expect_close(got, reference.rolling_cache_append(x), call, lookalikes=bugs.rolling_cache_append(x))


# -- streaming_attention_step --------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
STREAMING_ATTENTION_STEP_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("streaming_attention_step")
@pytest.mark.parametrize("case", STREAMING_ATTENTION_STEP_CASES, ids=case_ids(STREAMING_ATTENTION_STEP_CASES))
def test_streaming_attention_step_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "streaming_attention_step", x)
    expect_close(got, oracles.streaming_attention_step(x), call, lookalikes=bugs.streaming_attention_step(x),
                 reference="TODO: the oracle's name")


@exercise("streaming_attention_step")
def test_streaming_attention_step_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "streaming_attention_step", x)
    expect_close(got, reference.streaming_attention_step(x), call, lookalikes=bugs.streaming_attention_step(x))


# -- every exercise -----------------------------------------------------------------------

test_would_run_on_a_gpu = portability_check([
    portable("sliding_window_mask", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
    portable("rolling_cache_append", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
    portable("streaming_attention_step", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
])
