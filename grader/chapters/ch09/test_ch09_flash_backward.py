"""Hidden checks for chapter 9: The backward pass of tiled attention.

TODO: what the checks try, in a paragraph: the cases, the oracles they
compare with, what a failure says. Each check's docstring is the sentence a
student reads.
"""

import pytest
import torch

from grader.checks import Oracles, case_ids, exercise, portability_check, portable, run
from grader.compare import expect_close

# TODO: what the oracles compute (oracles.py).
oracles = Oracles("ch09")


# -- flash_attention_forward ---------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
FLASH_ATTENTION_FORWARD_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("flash_attention_forward")
@pytest.mark.parametrize("case", FLASH_ATTENTION_FORWARD_CASES, ids=case_ids(FLASH_ATTENTION_FORWARD_CASES))
def test_flash_attention_forward_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "flash_attention_forward", x)
    expect_close(got, oracles.flash_attention_forward(x), call, lookalikes=bugs.flash_attention_forward(x),
                 reference="TODO: the oracle's name")


@exercise("flash_attention_forward")
def test_flash_attention_forward_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "flash_attention_forward", x)
    expect_close(got, reference.flash_attention_forward(x), call, lookalikes=bugs.flash_attention_forward(x))


# -- flash_attention_backward --------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
FLASH_ATTENTION_BACKWARD_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("flash_attention_backward")
@pytest.mark.parametrize("case", FLASH_ATTENTION_BACKWARD_CASES, ids=case_ids(FLASH_ATTENTION_BACKWARD_CASES))
def test_flash_attention_backward_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "flash_attention_backward", x)
    expect_close(got, oracles.flash_attention_backward(x), call, lookalikes=bugs.flash_attention_backward(x),
                 reference="TODO: the oracle's name")


@exercise("flash_attention_backward")
def test_flash_attention_backward_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "flash_attention_backward", x)
    expect_close(got, reference.flash_attention_backward(x), call, lookalikes=bugs.flash_attention_backward(x))


# -- FlashAttentionFunction ----------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
FLASHATTENTIONFUNCTION_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("FlashAttentionFunction")
@pytest.mark.parametrize("case", FLASHATTENTIONFUNCTION_CASES, ids=case_ids(FLASHATTENTIONFUNCTION_CASES))
def test_flashattentionfunction_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "FlashAttentionFunction", x)
    expect_close(got, oracles.FlashAttentionFunction(x), call, lookalikes=bugs.FlashAttentionFunction(x),
                 reference="TODO: the oracle's name")


@exercise("FlashAttentionFunction")
def test_flashattentionfunction_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "FlashAttentionFunction", x)
    expect_close(got, reference.FlashAttentionFunction(x), call, lookalikes=bugs.FlashAttentionFunction(x))


# -- every exercise -----------------------------------------------------------------------

test_would_run_on_a_gpu = portability_check([
    portable("flash_attention_forward", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
    portable("flash_attention_backward", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
    portable("FlashAttentionFunction", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
])
