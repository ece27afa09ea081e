"""Hidden checks for chapter 7: memory-efficient attention.

Every exercise is checked against the reference and against PyTorch
(``torch.softmax``; ``F.scaled_dot_product_attention``, with chapter 4's
bottom-right causal mask as its ``attn_mask``, and ``torch.logsumexp`` of
the masked scaled scores for ``tiled_attention``'s lse; attention over all
the keys at once for ``merge_attention``), for block sizes that divide the
keys and that do not (1, 3, 4, all of them, more than all of them), unequal
query and key lengths, queries that see no key, batch dimensions and logits
large enough to overflow ``exp`` without the running max. On a mismatch,
known wrong implementations are run on the same inputs and a matching one's
hint goes with the failure. One check takes the road the chapter builds:
the student's ``tiled_attention`` over two parts of the keys, put together
by their ``merge_attention`` (skipped while ``tiled_attention`` is wrong,
which its own checks say).

The memory check is the chapter's point: ``tiled_attention`` with 1024
queries and 16384 keys runs in a worker of its own that may map 24 MiB
beyond what it maps before the file's first statement, as the kernel counts
it (``run_within``): the ``(L, S)`` scores alone take 64 MiB, so building
them fails, whatever the code does to hide it. Two more checks read the worker's own measure of
every operation (``RemoteSubmission.call(..., measure=True)``,
``grader.footprint``) and add a note, never a failure, since the student's
code can change that measure: a tensor as large as ``(L, S)`` (a whole
boolean mask fits the budget), and a max, sum or product over more than one
block of keys (blocks of queries each scored against every key at once),
or of a row for ``online_softmax``, whose output is as wide as its input.
"""

import pytest
import torch

from grader.chapters.ch07.bugs import BUGS
from grader.checks import case_ids, exercise, Oracles, portability_check, portable, run, run_measured, run_within
from grader.compare import CheckFailure, expect_close, note, shape_text, unpack

# PyTorch's softmax and attention (oracles.py).
oracles = Oracles("ch07")

WHOLE_MATRIX_HINT = next(bug.hint for bug in BUGS if bug.name == "whole-score-matrix")
# Two passes over whole rows: the right numbers, which no check can tell from an online
# softmax's (nor can the kernel: both hold the row they are given). Only the worker's own
# measure sees it, so it is a note, and no known bug (verify proves those caught).
WHOLE_ROW_HINT = ("looks like the max and the sum are taken over whole rows (two passes, as a plain "
                  "softmax does): right numbers, but online softmax keeps a running max and sum and "
                  "reads one block at a time")
# Blocks of queries, each scored against every key at once with a whole-row softmax: the
# right numbers in little memory, but no online softmax. Only the worker's own measure sees
# it (a block of queries against every key holds no more than a block of keys against every
# query), so it is a note; tests/test_ch07_memory_efficient_attention.py grades the code.
QUERY_BLOCKS_HINT = ("looks like the queries are taken a block at a time, each block against every key at "
                     "once (a whole-row softmax per block of queries): right numbers in little memory, but "
                     "not an online softmax; loop over blocks of keys, carrying a running max, sum and "
                     "output for every query, rescaled when the max grows (a loop over blocks of queries "
                     "may wrap that loop, as in FlashAttention-2)")
# ATen's names of the reductions a student writes most, as the student wrote them.
_OPERATIONS = {"amax": "a max (amax)", "max": "a max", "sum": "a sum", "mean": "a mean",
               "logsumexp": "logsumexp", "_softmax": "softmax", "cumsum": "a running sum (cumsum)",
               "mv": "a matrix product", "mm": "a matrix product", "bmm": "a matrix product"}


# -- online_softmax ----------------------------------------------------------------------

# (id, shape (..., N), block_size): blocks that divide N and blocks that do not, one entry a
# block, one block holding everything, a block longer than the row, batch dimensions.
SOFTMAX_CASES = [
    ("R3-N10-block3", (3, 10), 3),
    ("R3-N10-block4", (3, 10), 4),
    ("R3-N10-block5", (3, 10), 5),
    ("R3-N10-block1", (3, 10), 1),
    ("R3-N10-block10", (3, 10), 10),
    ("R3-N10-block16", (3, 10), 16),
    ("B2-R3-N7-block2", (2, 3, 7), 2),
    ("R4-N1-block1", (4, 1), 1),
]


@exercise("online_softmax")
@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=case_ids(SOFTMAX_CASES))
def test_online_softmax_equals_torch_softmax(submission, bugs, inputs, case):
    """equals torch.softmax(x, dim=-1) for block sizes that do and do not divide N"""
    _, shape, block_size = case
    x = 3 * inputs.randn(*shape)
    got, call = run(submission, "online_softmax", x, block_size)
    expect_close(got, oracles.softmax(x), call, lookalikes=bugs.online_softmax(x, block_size),
                 reference="torch.softmax(x, dim=-1)")


@exercise("online_softmax")
@pytest.mark.parametrize("case", SOFTMAX_CASES[::3], ids=case_ids(SOFTMAX_CASES[::3]))
def test_online_softmax_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    _, shape, block_size = case
    x = 3 * inputs.randn(*shape, dtype=torch.float64)
    got, call = run(submission, "online_softmax", x, block_size)
    expect_close(got, reference.online_softmax(x, block_size), call,
                 lookalikes=bugs.online_softmax(x, block_size))


@exercise("online_softmax")
def test_online_softmax_when_the_max_grows_block_after_block(submission, bugs, inputs):
    """rescales the running sum each time a block raises the max (rows that increase)"""
    x = torch.linspace(-4, 4, 12).repeat(2, 1) + 0.1 * inputs.randn(2, 12)  # (2, 12), max in every block
    got, call = run(submission, "online_softmax", x, 3)
    expect_close(got, oracles.softmax(x), call, lookalikes=bugs.online_softmax(x, 3),
                 reference="torch.softmax(x, dim=-1)")


@exercise("online_softmax")
def test_online_softmax_large_logits(submission, bugs, inputs):
    """stays finite for logits in the thousands (exp is taken after subtracting the running max)"""
    x = 1000 * inputs.randn(3, 10)
    got, call = run(submission, "online_softmax", x, 4)
    expect_close(got, oracles.softmax(x), call, lookalikes=bugs.online_softmax(x, 4),
                 reference="torch.softmax(x, dim=-1)")


@exercise("online_softmax")
def test_online_softmax_reads_one_block_at_a_time(submission, inputs):
    """reads one block of a row at a time (a note, from the worker's own measure: it costs no point)"""
    x, block_size = inputs.randn(4, 1000), 64
    got, footprint, call = run_measured(submission, "online_softmax", x, block_size)
    expect_close(got, oracles.softmax(x), call, reference="torch.softmax(x, dim=-1)")
    widest = footprint.reduction
    if widest.width > block_size:
        note(f"{call} ran {_OPERATIONS.get(widest.op, widest.op)} over {widest.width:,} numbers at once "
             f"(of a {shape_text(widest.shape)} tensor); online softmax reads one block of {block_size} "
             "at a time", hint=WHOLE_ROW_HINT)


# -- tiled_attention -----------------------------------------------------------------------

# (id, batch dims, L, S, d, d_v, block_size, causal)
TILED_CASES = [
    ("L10-S10-block3", (2,), 10, 10, 8, 8, 3, False),
    ("L10-S10-block4-causal", (2,), 10, 10, 8, 8, 4, True),
    ("L4-S10-block4-causal", (2,), 4, 10, 8, 6, 4, True),
    ("L6-S10-block1", (1,), 6, 10, 4, 4, 1, False),
    ("L5-S10-block10-causal", (2,), 5, 10, 8, 8, 10, True),
    ("L7-S10-block16", (2,), 7, 10, 4, 5, 16, False),
    ("B2-H3-L5-S9-block2-causal", (2, 3), 5, 9, 4, 4, 2, True),
    ("L12-S10-block3-causal", (1,), 12, 10, 4, 4, 3, True),
    ("L1-S10-block3-d1", (3,), 1, 10, 1, 2, 3, False),
]


def _tiled_inputs(inputs, case, dtype=torch.float32):
    _, batch, num_queries, num_keys, width, value_width, _, _ = case
    return (inputs.randn(*batch, num_queries, width, dtype=dtype),
            inputs.randn(*batch, num_keys, width, dtype=dtype),
            inputs.randn(*batch, num_keys, value_width, dtype=dtype))


def _causal_text(causal: bool, num_queries: int, num_keys: int) -> tuple[str, str]:
    """What the output and the lse are compared with, for messages."""
    if not causal:
        return "F.scaled_dot_product_attention", "torch.logsumexp of the scaled scores"
    offset = num_keys - num_queries
    mask = (f" with chapter 4's causal mask ({num_queries} queries, {num_keys} keys: query i sees keys "
            f"0 .. i {'+' if offset >= 0 else '-'} {abs(offset)})")
    return "F.scaled_dot_product_attention" + mask, "torch.logsumexp of the scaled scores" + mask


def _expect_tiled(got, call: str, expected, lookalikes=None, reference=("the reference", "the reference"),
                  rtol: float | None = None) -> None:
    """An ``(out, lse)`` answer of tiled_attention, the output first: most bugs show there,
    and an output that is right leaves the log-sum-exp to explain. ``reference``: what
    each was computed by, for messages."""
    out, lse = unpack(got, ("out", "lse"), call)
    expect_close(out, expected[0], f"out of {call}", reference=reference[0], rtol=rtol,
                 lookalikes=lookalikes.part(0, got) if lookalikes else None)
    expect_close(lse, expected[1], f"lse of {call}", reference=reference[1], rtol=rtol,
                 lookalikes=lookalikes.part(1, got) if lookalikes else None)


@exercise("tiled_attention")
@pytest.mark.parametrize("case", TILED_CASES, ids=case_ids(TILED_CASES))
def test_tiled_equals_pytorch_attention(submission, bugs, inputs, case):
    """equals F.scaled_dot_product_attention, lse torch.logsumexp of the scaled scores (causal: bottom-right)"""
    q, k, v = _tiled_inputs(inputs, case)
    block_size, causal = case[-2:]
    got, call = run(submission, "tiled_attention", q, k, v, block_size, causal=causal)
    _expect_tiled(got, call, oracles.attention_with_lse(q, k, v, causal),
                  bugs.tiled_attention(q, k, v, block_size, causal=causal),
                  reference=_causal_text(causal, q.shape[-2], k.shape[-2]))


@exercise("tiled_attention")
@pytest.mark.parametrize("case", TILED_CASES[1::2], ids=case_ids(TILED_CASES[1::2]))
def test_tiled_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    q, k, v = _tiled_inputs(inputs, case, torch.float64)
    block_size, causal = case[-2:]
    got, call = run(submission, "tiled_attention", q, k, v, block_size, causal=causal)
    _expect_tiled(got, call, reference.tiled_attention(q, k, v, block_size, causal=causal),
                  bugs.tiled_attention(q, k, v, block_size, causal=causal))


@exercise("tiled_attention")
def test_tiled_query_without_keys(submission, bugs, inputs):
    """a query that sees no key (causal, more queries than keys) gets output zeros and lse -inf, not NaN"""
    q, k, v = inputs.randn(2, 7, 4), inputs.randn(2, 4, 4), inputs.randn(2, 4, 3)  # queries 0 .. 2 see no key
    got, call = run(submission, "tiled_attention", q, k, v, 3, causal=True)
    _expect_tiled(got, call, oracles.attention_with_lse(q, k, v, True),
                  bugs.tiled_attention(q, k, v, 3, causal=True), reference=_causal_text(True, 7, 4))


@exercise("tiled_attention")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tiled_large_logits(submission, bugs, inputs, causal):
    """stays finite and accurate for scores in the thousands (the max is subtracted before exp)"""
    # float64, where exp of scores in the thousands overflows too. Rounded to
    # float32 (which the precision rule allows inside) they move by 1e-4 and
    # more, and the weights with them: rtol 1e-2 leaves room for that, and
    # none for a missing max (inf or nan) or a rescaling gone wrong.
    q, k = (30 * inputs.randn(2, n, 8, dtype=torch.float64) for n in (6, 10))  # (2, 6, 8), (2, 10, 8)
    v = inputs.randn(2, 10, 8, dtype=torch.float64)  # (2, 10, 8)
    got, call = run(submission, "tiled_attention", q, k, v, 3, causal=causal)
    _expect_tiled(got, call, oracles.attention_with_lse(q, k, v, causal),
                  bugs.tiled_attention(q, k, v, 3, causal=causal),
                  reference=_causal_text(causal, 6, 10), rtol=1e-2)


# What tiled attention with L = 1024 queries and S = 16384 keys (d = 8, blocks of 128) may
# map beyond what its worker maps before the file runs, as the kernel counts it. The
# (L, S) scores alone take 64 MiB in float32, however they are computed (in place, in a
# shared mapping); in float16 they would be too coarse for the values to pass. Measured on
# Linux with torch 2.13: the reference needs at most 10 MiB, the correct-style corpus 14
# (Llama's additive mask per block, a first matrix product's buffers included), the
# whole-matrix known bug about 200. Few queries and many keys keep (L, block) pieces small
# and a FlashAttention-2 double loop short (8 blocks of queries).
# No smaller size keeps every verdict (measured without the worker's own imports, which
# add 3 to 4 MiB): the budget must stay below a whole boolean causal mask, ones(L, S) and
# its tril, which tests/test_ch07_memory_efficient_attention.py fails (32.75 MiB here, 16.75
# with 512 queries), and above blocks of 16 queries against every key, which it passes (8 at
# either size), and float64 blocks (the einsum corpus file: 8 here, 11 with 512 queries, for
# the heap's holes). With 512 queries that leaves no room; with 1024, 24 MiB is 10 above the
# most a correct file needs (llama's, 14 with the imports) and 8.75 below the whole mask.
MEMORY_BUDGET = 24 * 2**20
LAST_QUERIES = 128  # of the 1024, compared with the reference


@exercise("tiled_attention")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tiled_never_builds_the_score_matrix(submission, reference, inputs, causal):
    """with 1024 queries, 16384 keys and blocks of 128, needs no more than 24 MiB of memory, as the kernel counts it (the (L, S) scores alone take 64 MiB)"""
    num_queries, num_keys, block_size = 1024, 16384, 128
    q, k, v = inputs.randn(1, num_queries, 8), inputs.randn(1, num_keys, 8), inputs.randn(1, num_keys, 8)
    got, call = run_within(submission, MEMORY_BUDGET, "tiled_attention", q, k, v, block_size, causal=causal,
                           hint=WHOLE_MATRIX_HINT)
    # The values show that the budget was not kept by computing worse (in float16, skipping
    # keys); the other checks judge them, against PyTorch. So the last LAST_QUERIES queries
    # alone are compared, with the reference (tiled, a fifth of PyTorch's time here) run on
    # them alone: an eighth of its time on all 1024 (0.03 s instead of 0.23, full and causal
    # together). As the last rows, they keep their bottom-right positions S - n + i, and
    # they see nearly every key.
    out, lse = unpack(got, ("out", "lse"), call)
    if not all(isinstance(part, torch.Tensor) and tuple(part.shape) == shape
               for part, shape in ((out, (1, num_queries, 8)), (lse, (1, num_queries)))):
        _expect_tiled(got, call, reference.tiled_attention(q, k, v, block_size, causal=causal))  # the shapes' message
        return
    last = LAST_QUERIES
    _expect_tiled((out[..., -last:, :], lse[..., -last:]), f"{call} at its last {last} queries",
                  reference.tiled_attention(q[..., -last:, :], k, v, block_size, causal=causal))


@exercise("tiled_attention")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tiled_reads_the_keys_block_by_block(submission, inputs, causal):
    """reads the keys one block at a time (a note, from the worker's own measure: it costs no point)"""
    length, width, block_size = 512, 16, 64
    q, k, v = (inputs.randn(1, length, width) for _ in range(3))
    got, footprint, call = run_measured(submission, "tiled_attention", q, k, v, block_size, causal=causal)
    _expect_tiled(got, call, oracles.attention_with_lse(q, k, v, causal),
                  reference=_causal_text(causal, length, length))
    largest = footprint.largest
    if largest.numel >= length * length:
        where = f" at {submission.submission.where(largest.line)}" if largest.line else ""
        note(f"{call} made a {shape_text(largest.shape)} tensor{where}, as large as the whole (L, S) "
             "scores; tiled attention keeps (L, block) pieces", hint=WHOLE_MATRIX_HINT)
    widest = footprint.reduction
    # A block's scores sum over the features, its weights @ values over its keys.
    if widest.width > max(block_size, width):
        note(f"{call} ran {_OPERATIONS.get(widest.op, widest.op)} over {widest.width:,} numbers at once "
             f"(of a {shape_text(widest.shape)} tensor); tiled attention reads the keys {block_size} at "
             f"a time: each max and sum of scores, and each weights @ values, over one block of keys, "
             f"with a running max and sum carried from block to block", hint=QUERY_BLOCKS_HINT)


# -- merge_attention -----------------------------------------------------------------------


def _merge_inputs(inputs, case, logit_scale: float = 1.0):
    """``(q, k, v, split)`` for a case of MERGE_CASES."""
    _, batch, num_queries, num_keys, width, split = case
    q = logit_scale * inputs.randn(*batch, num_queries, width)
    k = logit_scale * inputs.randn(*batch, num_keys, width)
    return q, k, inputs.randn(*batch, num_keys, width), split


# (id, batch dims, L, S, d, split): keys 0 .. split - 1 in part A, the rest in part B.
MERGE_CASES = [
    ("B2-L4-S10-split3", (2,), 4, 10, 8, 3),
    ("B1-H2-L5-S6-split5", (1, 2), 5, 6, 4, 5),
    ("B3-L3-S7-split1", (3,), 3, 7, 4, 1),
    ("B2-L1-S8-split4-d1", (2,), 1, 8, 1, 4),
]


@exercise("merge_attention")
@pytest.mark.parametrize("case", MERGE_CASES, ids=case_ids(MERGE_CASES))
def test_merge_equals_attention_over_all_keys(submission, bugs, inputs, case):
    """gives the output and log-sum-exp of attention over keys A and B together"""
    q, k, v, split = _merge_inputs(inputs, case)
    parts = oracles.split_parts(q, k, v, split)
    got, call = run(submission, "merge_attention", *parts)
    _expect_merged(got, call, oracles.attention_with_lse(q, k, v), bugs.merge_attention(*parts),
                   "F.scaled_dot_product_attention and torch.logsumexp over all the keys")


@exercise("merge_attention")
@pytest.mark.parametrize("case", MERGE_CASES[::2], ids=case_ids(MERGE_CASES[::2]))
def test_merge_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    q, k, v, split = _merge_inputs(inputs, case)
    parts = oracles.split_parts(q, k, v, split)
    got, call = run(submission, "merge_attention", *parts)
    _expect_merged(got, call, reference.merge_attention(*parts), bugs.merge_attention(*parts),
                   "the reference")


@exercise("merge_attention")
def test_merge_large_scores(submission, bugs, inputs):
    """stays finite when the log-sum-exps are in the hundreds (exp of them overflows)"""
    q, k, v, split = _merge_inputs(inputs, MERGE_CASES[0], logit_scale=12.0)
    parts = oracles.split_parts(q.double(), k.double(), v.double(), split)
    parts = [part.float() for part in parts]
    got, call = run(submission, "merge_attention", *parts)
    expected = [part.float() for part in oracles.attention_with_lse(q.double(), k.double(), v.double())]
    _expect_merged(got, call, expected, bugs.merge_attention(*parts),
                   "attention over all the keys, in float64")


@exercise("merge_attention")
def test_merge_with_an_empty_part(submission, bugs, inputs):
    """a part with no keys (lse -inf, output 0) leaves the other part as it is"""
    q, k, v, _ = _merge_inputs(inputs, MERGE_CASES[0])
    parts = oracles.split_parts(q, k, v, 0)  # part A has no key
    got, call = run(submission, "merge_attention", *parts)
    _expect_merged(got, call, oracles.attention_with_lse(q, k, v), bugs.merge_attention(*parts),
                   "part B alone (part A has no key)")


# (id, batch dims, L, S, d, split, causal): tiled_attention over keys 0 .. split - 1 (part A)
# and over the rest (part B), then merged. Causal: every query sees the whole of part A
# (split <= S - L + 1: a KV cache, as in chunked prefill), and part B with the bottom-right
# mask, which for the last keys is the whole mask's own. With S - split < L, the first queries
# see no key of part B: (zeros, -inf) from tiled_attention, weight 0 in the merge.
ROAD_CASES = [
    ("B2-L6-S10-halves", (2,), 6, 10, 8, 5, False),
    ("B2-L4-S10-cache6-causal", (2,), 4, 10, 8, 6, True),
    ("H3-L4-S10-cache7-causal", (3,), 4, 10, 4, 7, True),
]


@exercise("merge_attention")
@pytest.mark.parametrize("case", ROAD_CASES, ids=case_ids(ROAD_CASES))
def test_merge_puts_your_tiled_attention_together(submission, bugs, inputs, case):
    """merges the (out, lse) of your tiled_attention over two parts of the keys into attention over all"""
    _, batch, num_queries, num_keys, width, split, causal = case
    q, k, v = (inputs.randn(*batch, n, width) for n in (num_queries, num_keys, num_keys))
    parts = []
    for keys, masked in ((slice(0, split), False), (slice(split, num_keys), causal)):
        k_part, v_part = k[..., keys, :], v[..., keys, :]  # (..., S_part, d)
        try:  # a wrong part is tiled_attention's to answer for, in its own checks
            got, call = run(submission, "tiled_attention", q, k_part, v_part, 3, causal=masked)
            _expect_tiled(got, call, oracles.attention_with_lse(q, k_part, v_part, masked),
                          reference=_causal_text(masked, num_queries, k_part.shape[-2]))
        except CheckFailure as failure:
            pytest.skip(f"tiled_attention is not right yet, so its parts cannot be merged: {failure.message}")
        parts += list(got)
    got, call = run(submission, "merge_attention", *parts)
    _expect_merged(got, call, oracles.attention_with_lse(q, k, v, causal), bugs.merge_attention(*parts),
                   "attention over all the keys" + (" with chapter 4's causal mask" if causal else ""))


def _expect_merged(got, call: str, expected, lookalikes, reference: str) -> None:
    """An ``(out, lse)`` pair, the log-sum-exp first: it explains the output."""
    out, lse = unpack(got, ("out", "lse"), call)
    expect_close(lse, expected[1], f"lse of {call}", lookalikes=lookalikes.part(1, got), reference=reference)
    expect_close(out, expected[0], f"out of {call}", lookalikes=lookalikes.part(0, got), reference=reference)


# -- every exercise -----------------------------------------------------------------------

test_would_run_on_a_gpu = portability_check([
    portable("online_softmax", lambda inputs: ((inputs.randn(3, 10), 4), {})),
    portable("tiled_attention", lambda inputs: (
        _tiled_inputs(inputs, TILED_CASES[2]) + (4,), {"causal": True})),
    portable("merge_attention", lambda inputs: (
        oracles.split_parts(*_merge_inputs(inputs, MERGE_CASES[0])[:3], 3), {})),
])
