"""Hidden checks for chapter 2: padding masks, mask conventions, cross-attention.

Every exercise is checked four ways: against the reference solution on
several shapes, against PyTorch's own functions or a loop (an
independent oracle), against properties any correct answer has, and, on a
mismatch, against known wrong implementations, whose hint then goes with the
failure.

Many cases put ``B == L`` or ``L == S`` on purpose: a mask lined up on the
wrong axis raises an error when the sizes differ, but broadcasts silently,
and wrongly, when they are equal.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

from grader.checks import (
    broadcast_shape,
    case_ids,
    exercise,
    expect_attention,
    expect_finite,
    expect_gradients,
    expect_raises,
    NO_KEY,
    Oracles,
    portability_check,
    portable,
    run,
    run_with_gradients,
)
from grader.compare import (
    expect_close,
    expect_like,
    expect_true,
    fail,
    matches,
    unpack,
)

oracles = Oracles("ch02")

CONVENTIONS = ("attend", "block", "additive")


def _lengths(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


# -- padding_mask ----------------------------------------------------------------------

# (id, lengths, max_len): lengths of 0 and of the maximum, max_len beyond every
# length, one sequence, B == S (a transposed mask keeps its shape).
PADDING_CASES = [
    ("B3-lengths-3-1-4", (3, 1, 4), None),
    ("B4-with-0-max_len-7", (2, 0, 5, 5), 7),
    ("B1-length-6", (6,), None),
    ("B3-S3-square", (1, 3, 2), None),
    ("B2-all-short-max_len-5", (1, 2), 5),
]


@exercise("padding_mask")
@pytest.mark.parametrize("case", PADDING_CASES, ids=case_ids(PADDING_CASES))
def test_padding_mask_matches_reference(submission, reference, bugs, case):
    """matches the reference"""
    _, values, max_len = case
    lengths = _lengths(*values)
    got, call = run(submission, "padding_mask", lengths, max_len=max_len)
    expect_close(got, reference.padding_mask(lengths, max_len=max_len), f"{call} with lengths {list(values)}",
                 lookalikes=bugs.padding_mask(lengths, max_len=max_len))


@exercise("padding_mask")
@pytest.mark.parametrize("case", PADDING_CASES[:2], ids=case_ids(PADDING_CASES[:2]))
def test_padding_mask_matches_loop(submission, bugs, case):
    """matches a mask built position by position"""
    _, values, max_len = case
    lengths = _lengths(*values)
    got, call = run(submission, "padding_mask", lengths, max_len=max_len)
    expected = oracles.padding_mask(lengths, max_len or max(values))
    expect_close(got, expected, f"{call} with lengths {list(values)}",
                 lookalikes=bugs.padding_mask(lengths, max_len=max_len), reference="a loop over the positions")


@exercise("padding_mask")
def test_padding_mask_rows_start_with_their_length(submission):
    """row b holds exactly lengths[b] Trues, all before the first False"""
    lengths = _lengths(4, 0, 9, 1, 6)
    got, call = run(submission, "padding_mask", lengths, max_len=9)
    call = f"{call} with lengths {lengths.tolist()}"
    expect_like(got, torch.empty(5, 9, dtype=torch.bool), call)
    counts = got.sum(dim=-1)
    expect_true(torch.equal(counts, lengths),
                f"{call}: the rows hold {counts.tolist()} Trues, expected {lengths.tolist()}")
    # Leading Trues: once a row turns False it stays False.
    expect_true(bool((got[:, 1:] <= got[:, :-1]).all()),
                f"{call}: a row has a True after a False; the real tokens come first")


@exercise("padding_mask")
def test_padding_mask_all_lengths_zero(submission):
    """gives shape (B, 0) when every length is 0 and max_len is None"""
    lengths = _lengths(0, 0)
    got, call = run(submission, "padding_mask", lengths)
    expect_close(got, torch.zeros(2, 0, dtype=torch.bool), f"{call} with lengths [0, 0]",
                 reference="an empty (2, 0) mask")


@exercise("padding_mask")
def test_padding_mask_of_an_empty_batch(submission):
    """gives shape (0, S) for a batch of no sequences"""
    # Always with max_len: the docstring leaves lengths.max() of no lengths open.
    got, call = run(submission, "padding_mask", _lengths(), max_len=4)
    expect_close(got, torch.zeros(0, 4, dtype=torch.bool), f"{call} with lengths []",
                 reference="an empty (0, 4) mask")


# -- convert_mask ----------------------------------------------------------------------


def _pair_ids(pairs):
    return [f"{source}-to-{target}" for source, target in pairs]


PAIRS = list(itertools.product(CONVENTIONS, CONVENTIONS))


@exercise("convert_mask")
@pytest.mark.parametrize("source, target", PAIRS, ids=_pair_ids(PAIRS))
def test_convert_mask_matches_reference(submission, reference, bugs, inputs, source, target):
    """matches the reference"""
    attend = inputs.mask(2, 4, 5, keep=0.5, empty_rows=True)
    mask = oracles.mask_in_convention(attend, source, inputs.randn(2, 4, 5))
    got, call = run(submission, "convert_mask", mask, source, target)
    expect_close(got, reference.convert_mask(mask, source, target), call,
                 lookalikes=bugs.convert_mask(mask, source, target))


@exercise("convert_mask")
@pytest.mark.parametrize("shape", [(7,), (3, 1, 4, 6)], ids=["S7", "B3-1-L4-S6"])
@pytest.mark.parametrize("source", CONVENTIONS)
def test_convert_mask_keeps_any_shape(submission, reference, bugs, inputs, shape, source):
    """keeps the mask's shape, whatever its number of dimensions"""
    attend = inputs.mask(*shape, keep=0.5)
    mask = oracles.mask_in_convention(attend, source, torch.zeros(shape))
    for target in CONVENTIONS:
        if target == source:
            continue
        got, call = run(submission, "convert_mask", mask, source, target)
        expect_close(got, reference.convert_mask(mask, source, target), call,
                     lookalikes=bugs.convert_mask(mask, source, target))


@exercise("convert_mask")
@pytest.mark.parametrize("source", ["attend", "block"])
def test_convert_mask_additive_holds_zero_and_minus_infinity(submission, inputs, source):
    """an additive result holds exactly 0 where kept and -inf where blocked, in float32"""
    attend = inputs.mask(3, 6, keep=0.5)
    mask = oracles.mask_in_convention(attend, source, torch.zeros(3, 6))
    got, call = run(submission, "convert_mask", mask, source, "additive")
    expect_like(got, torch.empty(3, 6), call)
    expect_true(bool((got[attend] == 0).all()), f"{call}: kept entries are not exactly 0.0")
    expect_true(bool(torch.isneginf(got[~attend]).all()),
                f"{call}: blocked entries are not -inf (a finite number such as -1e9 still "
                "leaves weight on a query whose keys are all blocked)")


@exercise("convert_mask")
@pytest.mark.parametrize("via", ["block", "additive"])
def test_convert_mask_round_trip(submission, inputs, via):
    """converting to another convention and back gives the mask back"""
    attend = inputs.mask(2, 5, 6, keep=0.5, empty_rows=True)
    there, call_there = run(submission, "convert_mask", attend, "attend", via)
    expect_like(there, oracles.mask_in_convention(attend, via, torch.zeros(2, 5, 6)), call_there)
    back, call_back = run(submission, "convert_mask", there, via, "attend")
    expect_close(back, attend, f"{call_back} after {call_there}", reference="the mask you started from")


@exercise("convert_mask")
def test_convert_mask_additive_drives_pytorch_attention(submission, inputs):
    """F.scaled_dot_product_attention gives the same output with the additive mask as with the bool one"""
    q, k, v = inputs.randn(2, 5, 8), inputs.randn(2, 7, 8), inputs.randn(2, 7, 3)
    attend = inputs.mask(2, 5, 7, keep=0.5)
    attend[1, 3] = False  # a query with no key: 0 with -inf, an average of v with -1e9
    got, call = run(submission, "convert_mask", attend, "attend", "additive")
    expect_like(got, torch.empty(2, 5, 7), call)
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=got)
    expected, _ = oracles.attention(q, k, v, attend)
    expect_close(output, expected, f"F.scaled_dot_product_attention(q, k, v, attn_mask={call}) "
                 "(query [1, 3] may attend to no key)", reference="the same attention with the bool mask")


@exercise("convert_mask")
def test_convert_mask_block_drives_multihead_attention(submission, inputs):
    """nn.MultiheadAttention with the converted key_padding_mask hides exactly the padding"""
    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    with torch.no_grad():  # seeded weights, not the module's random initial ones
        for parameter in attention.parameters():
            parameter.copy_(inputs.randn(*parameter.shape) * 0.5)
    query, context = inputs.randn(3, 4, 8), inputs.randn(3, 6, 8)
    lengths = _lengths(6, 2, 4)
    key_is_real = oracles.padding_mask(lengths, 6)  # (B, S), True = real key
    got, call = run(submission, "convert_mask", key_is_real, "attend", "block")
    expect_like(got, key_is_real, call)
    # Your mask reaches the module as the (N * H, L, S) attn_mask the module
    # would make of a key_padding_mask itself: a key_padding_mask's shape
    # check imports sympy, a costly import a grade does without.
    per_head = got[:, None, None, :].expand(3, attention.num_heads, 4, 6).flatten(0, 1)  # (N * H, L, S)
    with torch.no_grad():
        output, _ = attention(query, context, context, attn_mask=per_head)
    # The oracle runs each sequence on its real keys alone; no mask at all.
    expected = oracles.multihead_attention_over_real_keys(attention.state_dict(), attention.num_heads,
                                                          query, context, lengths)
    expect_close(output, expected, f"nn.MultiheadAttention(...)(query, context, context, key_padding_mask="
                 f"{call})", reference="attention over the real keys alone")


@exercise("convert_mask")
@pytest.mark.parametrize("names", [("keep", "attend"), ("attend", "bool")], ids=["bad-source", "bad-target"])
def test_convert_mask_rejects_unknown_conventions(submission, names):
    """raises ValueError for a convention name it does not know"""
    expect_raises(submission, "convert_mask", (torch.ones(2, 3, dtype=torch.bool), *names), {},
                  ("ValueError",), "a convention name it does not know")


@exercise("convert_mask")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=["float64", "float16"])
def test_convert_mask_additive_uses_dtype(submission, reference, bugs, inputs, dtype):
    """gives an additive mask in the dtype it is asked for"""
    attend = inputs.mask(3, 5, keep=0.5)
    got, call = run(submission, "convert_mask", attend, "attend", "additive", dtype=dtype)
    expect_close(got, reference.convert_mask(attend, "attend", "additive", dtype=dtype), call,
                 lookalikes=bugs.convert_mask(attend, "attend", "additive", dtype=dtype))


# -- combine_masks ---------------------------------------------------------------------

# (id, lengths (B of them, S = max), L, attn_mask kind): none, one (L, S) mask
# for every sequence, one (B, L, S) per sequence; B == L, L == S, B == 1.
COMBINE_CASES = [
    ("B2-S5-no-attn", (5, 3), 4, None),
    ("B3-L4-S5-shared", (5, 2, 4), 4, "shared"),
    ("B2-L3-S4-per-sequence-empty", (4, 0), 3, "per-sequence"),
    ("B3-L3-S3-shared", (3, 1, 2), 3, "shared"),
    ("B4-L4-S6-per-sequence", (6, 2, 5, 3), 4, "per-sequence"),
    ("B1-L2-S3-causal", (3,), 2, "causal"),
]


def _attn_mask(inputs, kind, batch, queries, keys):
    if kind is None:
        return None
    if kind == "shared":
        return inputs.mask(queries, keys, keep=0.6)
    if kind == "per-sequence":
        return inputs.mask(batch, queries, keys, keep=0.6)
    return oracles.causal_mask(queries, keys)  # bottom-right causal


def _combine_inputs(inputs, case):
    _, values, queries, kind = case
    key_padding = oracles.padding_mask(_lengths(*values), max(values))  # (B, S)
    return key_padding, _attn_mask(inputs, kind, len(values), queries, max(values))


@exercise("combine_masks")
@pytest.mark.parametrize("case", COMBINE_CASES, ids=case_ids(COMBINE_CASES))
def test_combine_masks_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    key_padding, attn_mask = _combine_inputs(inputs, case)
    got, call = run(submission, "combine_masks", key_padding, attn_mask=attn_mask)
    expect_close(got, reference.combine_masks(key_padding, attn_mask=attn_mask), call,
                 lookalikes=bugs.combine_masks(key_padding, attn_mask=attn_mask))


@exercise("combine_masks")
@pytest.mark.parametrize("case", COMBINE_CASES[:5], ids=case_ids(COMBINE_CASES[:5]))
def test_combine_masks_works_on_multi_head_scores(submission, bugs, inputs, case):
    """used on (B, H, L, S) scores, gives each sequence the attention of its own mask"""
    key_padding, attn_mask = _combine_inputs(inputs, case)
    batch, keys = key_padding.shape
    queries, heads = case[2], 2
    q, k, v = inputs.randn(batch, heads, queries, 4), inputs.randn(batch, heads, keys, 4), \
        inputs.randn(batch, heads, keys, 3)
    got, call = run(submission, "combine_masks", key_padding, attn_mask=attn_mask)
    lookalikes = bugs.combine_masks(key_padding, attn_mask=attn_mask)
    if not isinstance(got, torch.Tensor):
        expect_like(got, key_padding, call)  # says what came back instead of a tensor
    if got.dtype != torch.bool:
        fail(f"{call} has dtype {got.dtype}, expected torch.bool")
    scores_shape = (batch, heads, queries, keys)
    try:
        broadcast = broadcast_shape(got.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores_shape:
        fail(f"{call} has shape {tuple(got.shape)}, which does not broadcast to the scores' shape "
             f"{scores_shape} (B, H, L, S)", hint=_hint_of(got, lookalikes))
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=got)
    expect_close(output, oracles.per_sequence_attention(q, k, v, key_padding, attn_mask),
                 f"F.scaled_dot_product_attention on (B, H, L, S) = {scores_shape} scores "
                 f"with attn_mask={call}", reference="attention run one sequence at a time",
                 lookalikes=lambda: ((hint, _attention_or_none(q, k, v, mask)) for hint, mask in lookalikes()))


def _hint_of(got, lookalikes):
    return next((hint for hint, wrong in lookalikes() if matches(got, wrong)), None)


def _attention_or_none(q, k, v, mask):
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    except RuntimeError:  # a bug whose mask does not broadcast here
        return None


@exercise("combine_masks")
@pytest.mark.parametrize("case", [COMBINE_CASES[1], COMBINE_CASES[4]], ids=case_ids([COMBINE_CASES[1],
                                                                                     COMBINE_CASES[4]]))
def test_combine_masks_never_allows_more_than_either(submission, inputs, case):
    """allows a pair only where the padding and the attention mask both allow it"""
    key_padding, attn_mask = _combine_inputs(inputs, case)
    got, call = run(submission, "combine_masks", key_padding, attn_mask=attn_mask)
    batch, keys = key_padding.shape
    expect_like(got, torch.empty(batch, 1, case[2], keys, dtype=torch.bool), call)
    expect_true(not bool((got & ~key_padding[:, None, None, :]).any()),
                f"{call} allows attending to padded keys")
    expect_true(not bool((got & ~attn_mask.reshape(-1, 1, case[2], keys)).any()),
                f"{call} allows pairs that attn_mask blocks")


# -- cross_attention -------------------------------------------------------------------

# (id, B, L, S, d_x, d_c, d_k, d_v, context lengths or None): L != S,
# d_x != d_c, d_v != d_k; B == L (a (B, S) mask put against (B, L, S) scores
# lines B up with L and raises nothing); L == S with d_x == d_c (keys made from
# x, or padding that hides queries, keep the right shape); d_k = 1.
CROSS_CASES = [
    ("B2-L3-S5-dx6-dc4-dk8-dv3", 2, 3, 5, 6, 4, 8, 3, None),
    ("B2-L3-S5-dx6-dc4-dk8-dv3-padded", 2, 3, 5, 6, 4, 8, 3, (5, 2)),
    ("B3-L3-S6-dx4-dc5-dk4-dv5-padded", 3, 3, 6, 4, 5, 4, 5, (6, 3, 1)),
    ("B2-L4-S4-dx5-dc5-dk3-dv2-padded", 2, 4, 4, 5, 5, 3, 2, (4, 2)),
    ("B3-L2-S5-dx4-dc4-dk6-dv3-padded", 3, 2, 5, 4, 4, 6, 3, (3, 5, 1)),
    ("B1-L1-S7-dx3-dc2-dk1-dv1-padded", 1, 1, 7, 3, 2, 1, 1, (4,)),
]


def _cross_inputs(inputs, case, dtype=torch.float32):
    _, batch, queries, keys, d_x, d_c, d_k, d_v, lengths = case
    x = inputs.randn(batch, queries, d_x, dtype=dtype)
    context = inputs.randn(batch, keys, d_c, dtype=dtype)
    weights = (inputs.randn(d_k, d_x, dtype=dtype), inputs.randn(d_k, d_c, dtype=dtype),
               inputs.randn(d_v, d_c, dtype=dtype))
    return x, context, weights, None if lengths is None else _lengths(*lengths)


def _with_lengths(call: str, lengths) -> str:
    return call if lengths is None else f"{call} with context_lengths {lengths.tolist()}"


@exercise("cross_attention")
@pytest.mark.parametrize("case", CROSS_CASES, ids=case_ids(CROSS_CASES))
def test_cross_attention_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    x, context, weights, lengths = _cross_inputs(inputs, case)
    got, call = run(submission, "cross_attention", x, context, *weights, context_lengths=lengths)
    expect_attention(got, reference.cross_attention(x, context, *weights, context_lengths=lengths),
                     _with_lengths(call, lengths),
                     bugs.cross_attention(x, context, *weights, context_lengths=lengths))


@exercise("cross_attention")
@pytest.mark.parametrize("case", CROSS_CASES[:4], ids=case_ids(CROSS_CASES[:4]))
def test_cross_attention_matches_pytorch(submission, bugs, inputs, case):
    """matches F.linear + F.scaled_dot_product_attention with a mask of the real keys"""
    x, context, weights, lengths = _cross_inputs(inputs, case)
    got, call = run(submission, "cross_attention", x, context, *weights, context_lengths=lengths)
    expect_attention(got, oracles.cross_attention(x, context, *weights, lengths),
                     _with_lengths(call, lengths),
                     bugs.cross_attention(x, context, *weights, context_lengths=lengths), reference="PyTorch")


@exercise("cross_attention")
def test_cross_attention_empty_context_gives_zeros(submission, bugs, inputs):
    """a sequence whose context is empty (length 0) gets zero weights and a zero output, not NaN"""
    x, context, weights, _ = _cross_inputs(inputs, CROSS_CASES[4])
    lengths = _lengths(3, 0, 5)
    got, call = run(submission, "cross_attention", x, context, *weights, context_lengths=lengths)
    expect_attention(got, oracles.cross_attention(x, context, *weights, lengths),
                     f"{_with_lengths(call, lengths)} (sequence 1 has an empty context)",
                     bugs.cross_attention(x, context, *weights, context_lengths=lengths), reference="PyTorch")


@exercise("cross_attention")
def test_cross_attention_full_lengths_equal_no_padding(submission, inputs):
    """context_lengths that are all S give the same answer as no context_lengths"""
    x, context, weights, _ = _cross_inputs(inputs, CROSS_CASES[0])
    lengths = _lengths(5, 5)
    plain, call = run(submission, "cross_attention", x, context, *weights)
    full, call_full = run(submission, "cross_attention", x, context, *weights, context_lengths=lengths)
    output, attention = unpack(plain, ("output", "weights"), call)
    output_full, attention_full = unpack(full, ("output", "weights"), call_full)
    expect_like(attention, torch.empty(2, 3, 5), f"weights of {call}")
    expect_finite(attention, f"weights of {call}", nan_only=True)
    expect_finite(output, f"output of {call}", nan_only=True)
    expect_close(attention_full, attention, f"weights of {_with_lengths(call_full, lengths)}",
                 reference="your weights without context_lengths")
    expect_close(output_full, output, f"output of {_with_lengths(call_full, lengths)}",
                 reference="your output without context_lengths")


@exercise("cross_attention")
def test_cross_attention_ignores_padded_context(submission, inputs):
    """changing the padded context tokens changes nothing"""
    x, context, weights, lengths = _cross_inputs(inputs, CROSS_CASES[2])
    changed = context.clone()
    for b, length in enumerate(lengths.tolist()):
        changed[b, length:] = 100 * inputs.randn(context.shape[1] - length, context.shape[2])
    before, call = run(submission, "cross_attention", x, context, *weights, context_lengths=lengths)
    after, _ = run(submission, "cross_attention", x, changed, *weights, context_lengths=lengths)
    call = _with_lengths(call, lengths)
    output, attention = unpack(before, ("output", "weights"), call)
    output_changed, attention_changed = unpack(after, ("output", "weights"), call)
    expect_like(attention, torch.empty(3, 3, 6), f"weights of {call}")
    expect_finite(attention, f"weights of {call}", NO_KEY, nan_only=True)
    expect_finite(output, f"output of {call}", NO_KEY, nan_only=True)
    expect_close(attention_changed, attention, f"weights of {call} once the padded tokens change",
                 reference="your weights before the change")
    expect_close(output_changed, output, f"output of {call} once the padded tokens change",
                 reference="your output before the change")


@exercise("cross_attention")
def test_cross_attention_weights_are_probabilities_over_real_keys(submission, inputs):
    """weights are 0 on padded keys and each query's weights sum to 1 over the real keys"""
    case = CROSS_CASES[4]
    x, context, weights, lengths = _cross_inputs(inputs, case)
    got, call = run(submission, "cross_attention", x, context, *weights, context_lengths=lengths)
    call = _with_lengths(call, lengths)
    _, attention = unpack(got, ("output", "weights"), call)
    expect_like(attention, torch.empty(3, 2, 5), f"weights of {call}")
    expect_finite(attention, f"weights of {call}", NO_KEY)
    padded = ~oracles.padding_mask(lengths, 5)[:, None, :].expand(-1, 2, -1)  # (B, L, S)
    expect_true(bool((attention[padded] == 0).all()),
                f"weights of {call} are not exactly 0 on padded keys (positions >= context_lengths[b])")
    expect_true(bool((attention >= 0).all()), f"weights of {call} have negative entries")
    sums = attention.sum(dim=-1)
    expect_true(torch.allclose(sums, torch.ones_like(sums), atol=1e-5),
                f"weights of {call} do not sum to 1 over the keys (sums range from "
                f"{float(sums.min()):.4g} to {float(sums.max()):.4g})")


@exercise("cross_attention")
@pytest.mark.parametrize("lengths", [(5, 2, 1), (4, 0, 5)], ids=["padded", "empty-context"])
def test_cross_attention_gradients(submission, inputs, lengths):
    """has the gradients of PyTorch's attention (autograd, float64)"""
    x, context, weights, _ = _cross_inputs(inputs, CROSS_CASES[4], dtype=torch.float64)
    lengths = _lengths(*lengths)
    upstream = inputs.randn(3, 2, 3, dtype=torch.float64)
    (got, grads), call = run_with_gradients(submission, "cross_attention", [x, context, *weights],
                                            {"context_lengths": lengths}, [0, 1, 2, 3, 4], 0, upstream)
    call = _with_lengths(call, lengths)
    expect_attention(got, oracles.cross_attention(x, context, *weights, lengths), call, reference="PyTorch")
    expected = oracles.cross_attention_gradients(x, context, *weights, lengths, upstream)
    expect_gradients(grads, expected, ("x", "context", "w_q", "w_k", "w_v"), call)


# -- every exercise -----------------------------------------------------------------------

# A tensor made without device= stays on the CPU on a GPU machine; the
# worker's device tracking shows where, on any machine.
test_would_run_on_a_gpu = portability_check([
    portable("padding_mask", lambda inputs: ((_lengths(3, 5, 0),), {"max_len": 6})),
    portable("convert_mask", lambda inputs: ((inputs.mask(2, 4, 5), "attend", "additive"), {})),
    portable("combine_masks", lambda inputs: (_combine_inputs(inputs, ("", (5, 2), 3, "shared")), {})),
    portable("cross_attention", lambda inputs: (
        (lambda x, context, weights, lengths: ((x, context, *weights), {"context_lengths": lengths}))(
            *_cross_inputs(inputs, CROSS_CASES[1])))),
])
