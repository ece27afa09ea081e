"""Hidden checks for chapter 12: Multi-head latent attention.

TODO: what the checks try, in a paragraph: the cases, the oracles they
compare with, what a failure says. Each check's docstring is the sentence a
student reads.
"""

import pytest
import torch

from grader.checks import Oracles, case_ids, exercise, portability_check, portable, run
from grader.compare import expect_close

# TODO: what the oracles compute (oracles.py).
oracles = Oracles("ch12")


# -- MultiHeadLatentAttention --------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
MULTIHEADLATENTATTENTION_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("MultiHeadLatentAttention")
@pytest.mark.parametrize("case", MULTIHEADLATENTATTENTION_CASES, ids=case_ids(MULTIHEADLATENTATTENTION_CASES))
def test_multiheadlatentattention_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "MultiHeadLatentAttention", x)
    expect_close(got, oracles.MultiHeadLatentAttention(x), call, lookalikes=bugs.MultiHeadLatentAttention(x),
                 reference="TODO: the oracle's name")


@exercise("MultiHeadLatentAttention")
def test_multiheadlatentattention_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "MultiHeadLatentAttention", x)
    expect_close(got, reference.MultiHeadLatentAttention(x), call, lookalikes=bugs.MultiHeadLatentAttention(x))


# -- absorbed_decode -----------------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
ABSORBED_DECODE_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("absorbed_decode")
@pytest.mark.parametrize("case", ABSORBED_DECODE_CASES, ids=case_ids(ABSORBED_DECODE_CASES))
def test_absorbed_decode_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "absorbed_decode", x)
    expect_close(got, oracles.absorbed_decode(x), call, lookalikes=bugs.absorbed_decode(x),
                 reference="TODO: the oracle's name")


@exercise("absorbed_decode")
def test_absorbed_decode_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "absorbed_decode", x)
    expect_close(got, reference.absorbed_decode(x), call, lookalikes=bugs.absorbed_decode(x))


# -- latent_cache_bytes --------------------------------------------------------------------

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
LATENT_CACHE_BYTES_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("latent_cache_bytes")
@pytest.mark.parametrize("case", LATENT_CACHE_BYTES_CASES, ids=case_ids(LATENT_CACHE_BYTES_CASES))
def test_latent_cache_bytes_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "latent_cache_bytes", x)
    expect_close(got, oracles.latent_cache_bytes(x), call, lookalikes=bugs.latent_cache_bytes(x),
                 reference="TODO: the oracle's name")


@exercise("latent_cache_bytes")
def test_latent_cache_bytes_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "latent_cache_bytes", x)
    expect_close(got, reference.latent_cache_bytes(x), call, lookalikes=bugs.latent_cache_bytes(x))


# -- every exercise -----------------------------------------------------------------------

test_would_run_on_a_gpu = portability_check([
    portable("MultiHeadLatentAttention", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
    portable("absorbed_decode", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
    portable("latent_cache_bytes", lambda inputs: ((inputs.randn(2, 3, 4),), {})),
])
