"""Hidden checks for chapter 11: A paged KV cache.

TODO: what the checks try, in a paragraph: the cases, the oracles they
compare with, what a failure says. Each check's docstring is the sentence a
student reads.
"""

import pytest
import torch

from grader.checks import Oracles, case_ids, exercise, portability_check, portable, run
from grader.compare import expect_close

# TODO: what the oracles compute (oracles.py).
oracles = Oracles("ch11")


# -- BlockAllocator ------------------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
BLOCKALLOCATOR_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("BlockAllocator")
@pytest.mark.parametrize("case", BLOCKALLOCATOR_CASES, ids=case_ids(BLOCKALLOCATOR_CASES))
def test_blockallocator_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "BlockAllocator", x)
    expect_close(got, oracles.BlockAllocator(x), call, lookalikes=bugs.BlockAllocator(x),
                 reference="TODO: the oracle's name")


@exercise("BlockAllocator")
def test_blockallocator_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "BlockAllocator", x)
    expect_close(got, reference.BlockAllocator(x), call, lookalikes=bugs.BlockAllocator(x))


# -- append_to_pages -----------------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
APPEND_TO_PAGES_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("append_to_pages")
@pytest.mark.parametrize("case", APPEND_TO_PAGES_CASES, ids=case_ids(APPEND_TO_PAGES_CASES))
def test_append_to_pages_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "append_to_pages", x)
    expect_close(got, oracles.append_to_pages(x), call, lookalikes=bugs.append_to_pages(x),
                 reference="TODO: the oracle's name")


@exercise("append_to_pages")
def test_append_to_pages_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "append_to_pages", x)
    expect_close(got, reference.append_to_pages(x), call, lookalikes=bugs.append_to_pages(x))


# -- paged_attention -----------------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
PAGED_ATTENTION_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("paged_attention")
@pytest.mark.parametrize("case", PAGED_ATTENTION_CASES, ids=case_ids(PAGED_ATTENTION_CASES))
def test_paged_attention_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "paged_attention", x)
    expect_close(got, oracles.paged_attention(x), call, lookalikes=bugs.paged_attention(x),
                 reference="TODO: the oracle's name")


@exercise("paged_attention")
def test_paged_attention_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "paged_attention", x)
    expect_close(got, reference.paged_attention(x), call, lookalikes=bugs.paged_attention(x))


# -- every exercise -----------------------------------------------------------------------

test_would_run_on_a_gpu = portability_check([
    portable("BlockAllocator", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
    portable("append_to_pages", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
    portable("paged_attention", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
])
