"""Hidden checks for chapter 4: causal masks, causal self-attention, the KV cache.

Every exercise is checked against the reference on several shapes, against
PyTorch's own functions, against properties (a token never sees the future:
not in its output, not in its gradient; decoding with a cache gives the rows
of the full forward), and, on a mismatch, against known wrong versions.
"""

import pytest
import torch

from grader.checks import (
    case_ids,
    exercise,
    expect_mask,
    keys_text,
    expect_finite,
    expect_gradients,
    NO_KEY,
    Oracles,
    portability_check,
    portable,
    run,
    run_with_gradients,
)
from grader.compare import (
    describe,
    expect_close,
    expect_like,
    expect_true,
    fail,
    matches,
    matching_hint,
    unpack,
)

oracles = Oracles("ch04")

# float16 and bfloat16 answers are compared with the float32 reference cast
# down; a correct low-precision computation is off by a few units in the
# last place of each of its steps, more than compare.TOLERANCES allows.
LOW_PRECISION = {torch.float16: (1e-2, 5e-3), torch.bfloat16: (2e-2, 5e-2)}


# -- helpers -------------------------------------------------------------------------


def _tokens(start: int, stop: int) -> str:
    """``token 3`` or ``tokens 0..3``: the tokens ``start`` to ``stop - 1``."""
    return f"token {start}" if stop - start == 1 else f"tokens {start}..{stop - 1}"


def _weights(inputs, d_model, dim_qk, dim_v, d_out, dtype=torch.float32):
    """w_q, w_k, w_v, w_o in nn.Linear layout, scaled so activations stay near 1."""
    shapes = ((dim_qk, d_model), (dim_qk, d_model), (dim_v, d_model), (d_out, dim_v))
    return [(inputs.randn(*shape, dtype=torch.float64) / shape[1] ** 0.5).to(dtype) for shape in shapes]


def _step(submission, x_new, num_heads, weights, cache=None):
    """One call of attend_with_cache; the answer and the text of the call."""
    kwargs = {} if cache is None else {"cache": cache}
    return run(submission, "attend_with_cache", x_new, num_heads, *weights, **kwargs)


def _at(lookalikes, *path, then=None):
    """The lookalikes' values at ``path`` inside their nested tuple answers
    (passed through ``then`` if given), for ``expect_close(lookalikes=...)``."""
    def values():
        for hint, value in lookalikes():
            try:
                for index in path:
                    value = value[index]
                value = value if then is None else then(value)
            except (TypeError, IndexError):
                continue
            yield hint, value
    return values


def _split_step(got, call: str, lookalikes=None):
    """``(output, k_cache, v_cache)`` from an ``(output, (k, v))`` answer."""
    output, cache = unpack(got, ("output", "cache"), call)
    if not (isinstance(cache, (tuple, list)) and len(cache) == 2):
        hint = None
        if cache is None and lookalikes is not None:
            hint = next((h for h, value in lookalikes() if value[1] is None), None)
        fail(f"{call} returned the cache as {describe(cache)}, expected a tuple (k, v) of "
             "tensors (B, H, T_past + T_new, d)", hint=hint)
    return output, cache[0], cache[1]


# -- causal_mask -----------------------------------------------------------------------

# (id, L, S): S = None means S = L.
MASK_CASES = [
    ("L4", 4, None),
    ("L5-S5", 5, 5),
    ("L1", 1, None),
    ("L3-S7-chunk", 3, 7),
    ("L1-S6-one-step", 1, 6),
    ("L6-S2-more-queries", 6, 2),
]


def _mask_args(num_queries, num_keys):
    return (num_queries,) if num_keys is None else (num_queries, num_keys)


@exercise("causal_mask")
@pytest.mark.parametrize("case", MASK_CASES, ids=case_ids(MASK_CASES))
def test_causal_mask_matches_reference(submission, reference, bugs, case):
    """matches the reference"""
    args = _mask_args(*case[1:])
    got, call = run(submission, "causal_mask", *args, device=submission.device)
    expect_mask(got, reference.causal_mask(*args), call, bugs.causal_mask(*args))


@exercise("causal_mask")
@pytest.mark.parametrize("case", MASK_CASES[1:], ids=case_ids(MASK_CASES[1:]))
def test_causal_mask_matches_tril(submission, case):
    """matches torch.ones(L, S).tril(S - L) (bottom-right alignment)"""
    _, num_queries, num_keys = case
    num_keys = num_queries if num_keys is None else num_keys
    got, call = run(submission, "causal_mask", num_queries, num_keys, device=submission.device)
    expect_mask(got, oracles.causal_mask(num_queries, num_keys), call, reference="tril(S - L)")


@exercise("causal_mask")
def test_causal_mask_lets_a_token_see_itself_and_the_past(submission):
    """with L == S, a token sees itself and every earlier token, never a later one"""
    got, call = run(submission, "causal_mask", 6, device=submission.device)
    expect_like(got, torch.empty(6, 6, dtype=torch.bool), call)
    got = got.cpu()
    rows, columns = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    expect_true(bool(got.diagonal().all()),
                f"{call} blocks a token from itself (the diagonal must be True: "
                "triu(..., diagonal=1) blocks the future, diagonal=0 the token too)")
    expect_true(not bool(got[columns > rows].any()),
                f"{call} lets a token see a later token (True above the diagonal)")
    expect_true(bool(got[columns < rows].all()),
                f"{call} hides an earlier token from a later one (False below the diagonal)")


@exercise("causal_mask")
@pytest.mark.parametrize("num_queries, num_keys", [(1, 5), (3, 8)], ids=["L1-S5", "L3-S8"])
def test_causal_mask_newest_query_sees_every_key(submission, bugs, num_queries, num_keys):
    """with L < S, the last query (the newest token) sees every key"""
    got, call = run(submission, "causal_mask", num_queries, num_keys, device=submission.device)
    # Made before the verdict, as everywhere: the student edition records a
    # check's lookalikes while the reference passes it (grader.recorded).
    lookalikes = bugs.causal_mask(num_queries, num_keys)
    expect_like(got, oracles.causal_mask(num_queries, num_keys), call)
    last = got[-1].cpu()
    if not bool(last.all()):
        fail(f"{call}: the last query sees {keys_text(last)} of {num_keys}; it is the newest "
             f"token (position {num_keys - 1}) and must see them all", hint=matching_hint(got, lookalikes))


# -- causal_self_attention ------------------------------------------------------------------

# (id, B, T, d_model, H, D, D_v, d_out): one head, head width 1, D_v != D,
# d_out != d_model, a single token.
ATTENTION_CASES = [
    ("B2-T5-H2-D8", 2, 5, 8, 2, 8, 8, 8),
    ("B1-T7-H1-D6-Dv4", 1, 7, 6, 1, 6, 4, 6),
    ("B3-T4-H4-d1", 3, 4, 6, 4, 4, 4, 5),
    ("B2-T6-H3-D12-Dv6-out5", 2, 6, 8, 3, 12, 6, 5),
    ("B2-T1-H2-D4", 2, 1, 4, 2, 4, 4, 4),
]


def _attention_inputs(inputs, case, dtype=torch.float32):
    _, batch, length, d_model, num_heads, dim_qk, dim_v, d_out = case
    x = inputs.randn(batch, length, d_model, dtype=dtype)
    return x, num_heads, _weights(inputs, d_model, dim_qk, dim_v, d_out, dtype)


@exercise("causal_self_attention")
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=case_ids(ATTENTION_CASES))
def test_causal_self_attention_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    x, num_heads, weights = _attention_inputs(inputs, case)
    got, call = run(submission, "causal_self_attention", x, num_heads, *weights)
    expect_close(got, reference.causal_self_attention(x, num_heads, *weights), call,
                 lookalikes=bugs.causal_self_attention(x, num_heads, *weights))


@exercise("causal_self_attention")
@pytest.mark.parametrize("case", ATTENTION_CASES[:4], ids=case_ids(ATTENTION_CASES[:4]))
def test_causal_self_attention_matches_pytorch(submission, inputs, case):
    """matches F.scaled_dot_product_attention(is_causal=True) per head"""
    x, num_heads, weights = _attention_inputs(inputs, case)
    got, call = run(submission, "causal_self_attention", x, num_heads, *weights)
    expect_close(got, oracles.causal_self_attention(x, num_heads, *weights), call, reference="PyTorch")


# Lengths 0 (all padding) and T (no padding) included.
PADDED_LENGTHS = [5, 3, 0, 1]


@exercise("causal_self_attention")
@pytest.mark.parametrize("oracle", ["reference", "pytorch"])
def test_causal_self_attention_with_padding(submission, reference, bugs, inputs, oracle):
    """with padding (lengths 5, 3, 0, 1 of 5), never attends to padded keys"""
    x = inputs.randn(4, 5, 8)
    weights = _weights(inputs, 8, 8, 6, 8)
    lengths = torch.tensor(PADDED_LENGTHS)
    got, call = run(submission, "causal_self_attention", x, 2, *weights, lengths=lengths)
    call = f"{call} with lengths {PADDED_LENGTHS}"
    if oracle == "reference":
        expect_close(got, reference.causal_self_attention(x, 2, *weights, lengths=lengths), call,
                     lookalikes=bugs.causal_self_attention(x, 2, *weights, lengths=lengths))
    else:
        expect_close(got, oracles.causal_self_attention(x, 2, *weights, lengths=lengths), call,
                     reference="PyTorch (causal mask & key padding)")


@exercise("causal_self_attention")
def test_causal_self_attention_ignores_future_tokens(submission, inputs):
    """changing later tokens changes no earlier output"""
    x = inputs.randn(2, 7, 8)
    weights = _weights(inputs, 8, 8, 8, 6)
    before, call = run(submission, "causal_self_attention", x, 2, *weights)
    expect_like(before, torch.empty(2, 7, 6), call)
    for t in (0, 3):
        changed = x.clone()
        changed[:, t + 1:] = inputs.randn(2, 6 - t, 8)
        after, _ = run(submission, "causal_self_attention", changed, 2, *weights)
        expect_like(after, before, call)
        expect_finite(before[:, :t + 1], f"output for {_tokens(0, t + 1)} of {call}", NO_KEY, nan_only=True)
        expect_close(after[:, :t + 1], before[:, :t + 1],
                     f"output for {_tokens(0, t + 1)} of {call} after changing {_tokens(t + 1, 7)} "
                     "(a later token leaks into an earlier output)",
                     reference="your output before the change")


@exercise("causal_self_attention")
def test_causal_self_attention_gradient_is_causal(submission, inputs):
    """output t has zero gradient with respect to tokens after t (autograd, float64)"""
    x = inputs.randn(2, 6, 8, dtype=torch.float64)
    weights = _weights(inputs, 8, 8, 8, 4, dtype=torch.float64)
    for t in (0, 2, 5):
        upstream = torch.zeros(2, 6, 4, dtype=torch.float64)
        upstream[:, t] = inputs.randn(2, 4, dtype=torch.float64)  # only output row t
        (got, grads), call = run_with_gradients(submission, "causal_self_attention", [x, 2, *weights],
                                                {}, [0], None, upstream)
        expect_like(got, upstream, call)
        grad = grads[0]
        if grad is None:
            fail(f"{call}: the output does not depend on x through autograd")
        expect_like(grad, x, f"gradient of {call} with respect to x")
        # Tokens 0 .. t, which the test below reads as zero when they hold NaN.
        expect_finite(grad[:, :t + 1], f"the gradient of output row {t} of {call} with respect to x", NO_KEY,
                      nan_only=True)
        per_token = grad.abs().amax(dim=(0, 2))  # (T,)
        later = [s for s in range(t + 1, 6) if float(per_token[s]) > 1e-12]
        expect_true(not later, f"the gradient of output row {t} of {call} with respect to x is "
                               f"non-zero at token {later[0] if later else ''}: output {t} "
                               "depends on a later token")
        expect_true(float(per_token[:t + 1].max()) > 1e-8,
                    f"the gradient of output row {t} of {call} with respect to x is zero at "
                    f"tokens 0..{t}: output {t} must depend on itself and the past")


@exercise("causal_self_attention")
def test_causal_self_attention_gradients(submission, inputs):
    """has the gradients of PyTorch's causal attention, with padding (autograd, float64)"""
    x = inputs.randn(2, 5, 6, dtype=torch.float64)
    weights = _weights(inputs, 6, 6, 9, 5, dtype=torch.float64)
    lengths = torch.tensor([5, 3])
    upstream = inputs.randn(2, 5, 5, dtype=torch.float64)
    (got, grads), call = run_with_gradients(submission, "causal_self_attention", [x, 3, *weights],
                                            {"lengths": lengths}, [0, 2, 3, 4, 5], None, upstream)
    expect_close(got, oracles.causal_self_attention(x, 3, *weights, lengths=lengths), call,
                 reference="PyTorch")
    expected = oracles.causal_self_attention_gradients(x, 3, *weights, lengths, upstream)
    expect_gradients(grads, expected, ("x", "w_q", "w_k", "w_v", "w_o"), call)


@exercise("causal_self_attention")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_causal_self_attention_low_precision(submission, reference, bugs, inputs, dtype):
    """works in float16 and bfloat16 (compared with the float32 reference)"""
    x = inputs.randn(2, 6, 8)
    weights = _weights(inputs, 8, 8, 8, 6)
    lengths = torch.tensor([6, 2])
    low = [x.to(dtype), *(w.to(dtype) for w in weights)]
    got, call = run(submission, "causal_self_attention", low[0], 2, *low[1:], lengths=lengths)
    expected = reference.causal_self_attention(x, 2, *weights, lengths=lengths).to(dtype)
    rtol, atol = LOW_PRECISION[dtype]
    expect_close(got, expected, call,
                 lookalikes=bugs.causal_self_attention(low[0], 2, *low[1:], lengths=lengths),
                 rtol=rtol, atol=atol, reference="the float32 reference")


# -- attend_with_cache -----------------------------------------------------------------------

# (id, B, T_past, T_new, d_model, H, D, D_v, d_out); T_past None: no cache yet.
CACHE_CASES = [
    ("no-cache-B2-new3-H2", 2, None, 3, 8, 2, 8, 8, 8),
    ("B2-past4-new1-H2", 2, 4, 1, 8, 2, 8, 8, 8),
    ("B1-past5-new3-H1-Dv4", 1, 5, 3, 6, 1, 6, 4, 6),
    ("B3-past2-new2-H4-d1", 3, 2, 2, 6, 4, 4, 4, 5),
    ("B2-past3-new4-H3-D12-Dv6-out5", 2, 3, 4, 8, 3, 12, 6, 5),
]


def _random_cache(inputs, batch, past, num_heads, dim_qk, dim_v):
    if past is None:
        return None
    return (inputs.randn(batch, num_heads, past, dim_qk // num_heads),
            inputs.randn(batch, num_heads, past, dim_v // num_heads))


@exercise("attend_with_cache")
@pytest.mark.parametrize("case", CACHE_CASES, ids=case_ids(CACHE_CASES))
def test_attend_with_cache_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference: output and returned cache"""
    _, batch, past, new, d_model, num_heads, dim_qk, dim_v, d_out = case
    x_new = inputs.randn(batch, new, d_model)
    weights = _weights(inputs, d_model, dim_qk, dim_v, d_out)
    cache = _random_cache(inputs, batch, past, num_heads, dim_qk, dim_v)
    got, call = _step(submission, x_new, num_heads, weights, cache)
    lookalikes = bugs.attend_with_cache(x_new, num_heads, *weights, cache=cache)
    output, k, v = _split_step(got, call, lookalikes)
    expected_output, (expected_k, expected_v) = reference.attend_with_cache(x_new, num_heads, *weights,
                                                                            cache=cache)
    expect_close(k, expected_k, f"the key cache returned by {call}", lookalikes=_at(lookalikes, 1, 0))
    expect_close(v, expected_v, f"the value cache returned by {call}", lookalikes=_at(lookalikes, 1, 1))
    expect_close(output, expected_output, f"output of {call}", lookalikes=_at(lookalikes, 0))


@exercise("attend_with_cache")
def test_attend_with_cache_first_step_matches_pytorch(submission, inputs):
    """with no cache, is causal attention over the new tokens and caches their keys and values"""
    x = inputs.randn(2, 4, 8)
    weights = _weights(inputs, 8, 8, 6, 8)
    got, call = _step(submission, x, 2, weights)
    output, k, v = _split_step(got, call)
    expected_k, expected_v = oracles.keys_and_values(x, 2, weights[1], weights[2])  # (B, H, T, d)
    expect_close(k, expected_k, f"the key cache returned by {call}",
                 reference="x_new @ w_k.T split into heads")
    expect_close(v, expected_v, f"the value cache returned by {call}",
                 reference="x_new @ w_v.T split into heads")
    expect_close(output, oracles.causal_self_attention(x, 2, *weights), f"output of {call}",
                 reference="PyTorch (is_causal=True over the new tokens)")


@exercise("attend_with_cache")
def test_attend_with_cache_keeps_the_cache_it_is_given(submission, bugs, inputs):
    """leaves the cache it is given unchanged and returns it first, then the new tokens"""
    x_new = inputs.randn(2, 2, 8)
    weights = _weights(inputs, 8, 8, 8, 8)
    cache = _random_cache(inputs, 2, 5, 2, 8, 8)
    # The grader fails any call that changes its inputs (the cache too) in place.
    got, call = _step(submission, x_new, 2, weights, cache)
    lookalikes = bugs.attend_with_cache(x_new, 2, *weights, cache=cache)
    _, k, v = _split_step(got, call, lookalikes)
    for name, returned, given, index in (("key", k, cache[0], 0), ("value", v, cache[1], 1)):
        what = f"the {name} cache returned by {call}"
        if not isinstance(returned, torch.Tensor) or returned.dim() != 4 or returned.shape[-2] < 5:
            fail(f"{what} is {describe(returned)}, expected a tensor (2, 2, 7, 4): the 5 cached "
                 "tokens, then the 2 new ones", hint=matching_hint(returned, _at(lookalikes, 1, index)))
        expect_close(returned[:, :, :5], given, f"the first 5 tokens of {what} (the cached ones, "
                     "which come first)", lookalikes=_at(lookalikes, 1, index, then=lambda t: t[:, :, :5]),
                     reference="the cache passed in")


def _decode(submission, x, num_heads, weights, chunks, bugs):
    """Feed ``x`` to attend_with_cache in chunks of the given lengths, each step
    with the cache the previous one returned. Yields ``(start, stop, output,
    (k, v), call, lookalikes)`` for each step.

    The known bugs are asked with the right cache, not the student's, so
    that their answers depend on the check's inputs alone: the student
    edition holds only the answers to calls the reference's grade made. Once
    the student's cache has gone wrong, later steps are compared with the
    bug whose cache it matched, if one did: that bug's own decoding goes on
    from that cache."""
    all_k, all_v = oracles.keys_and_values(x, num_heads, weights[1], weights[2])  # (B, H, T, d)
    cache, start, astray, culprit = None, 0, False, None
    for size in chunks:
        stop = start + size
        chunk = x[:, start:stop]
        got, call = _step(submission, chunk, num_heads, weights, cache)
        right_cache = None if cache is None else (all_k[:, :, :start], all_v[:, :, :start])
        lookalikes = bugs.attend_with_cache(chunk, num_heads, *weights, cache=right_cache)
        output, k, v = _split_step(got, call, lookalikes)
        if astray:  # a wrong cache came in: only its bug can explain this step
            lookalikes = _blamed(culprit, got)
        elif not (matches(k, all_k[:, :, :stop]) and matches(v, all_v[:, :, :stop])):
            astray = True
            culprit = (matching_hint(k, _at(lookalikes, 1, 0)) if not matches(k, all_k[:, :, :stop])
                       else matching_hint(v, _at(lookalikes, 1, 1)))
        yield start, stop, output, (k, v), call, lookalikes
        cache, start = (k, v), stop


def _blamed(hint, got):
    """Lookalikes that give ``hint`` (if any) for the answer ``got`` itself."""
    return lambda: iter([] if hint is None else [(hint, got)])


@exercise("attend_with_cache")
def test_attend_with_cache_token_by_token_matches_full_forward(submission, reference, bugs, inputs):
    """decoding one token at a time gives the rows of the full causal forward"""
    x = inputs.randn(2, 6, 8)
    weights = _weights(inputs, 8, 8, 8, 6)
    full = reference.causal_self_attention(x, 2, *weights)  # (B, T, d_out)
    for start, stop, output, _, call, lookalikes in _decode(submission, x, 2, weights, [1] * 6, bugs):
        expect_close(output, full[:, start:stop], f"output of step {start} of token-by-token decoding, "
                     f"{call}", lookalikes=_at(lookalikes, 0),
                     reference=f"row {start} of causal_self_attention over all 6 tokens")


@exercise("attend_with_cache")
@pytest.mark.parametrize("chunks", [(3, 1, 2), (2, 4)], ids=["chunks-3-1-2", "chunks-2-4"])
def test_attend_with_cache_in_chunks_matches_full_forward(submission, bugs, inputs, chunks):
    """feeding a prompt in chunks gives the rows of the full causal forward"""
    x = inputs.randn(2, sum(chunks), 8)
    weights = _weights(inputs, 8, 8, 8, 6)
    full = oracles.causal_self_attention(x, 2, *weights)  # (B, T, d_out)
    for start, stop, output, _, call, lookalikes in _decode(submission, x, 2, weights, chunks, bugs):
        expect_close(output, full[:, start:stop], f"output for {_tokens(start, stop)} of a prompt fed in "
                     f"chunks of {list(chunks)}, {call}", lookalikes=_at(lookalikes, 0),
                     reference=f"the rows of PyTorch's causal attention over all {len(x[0])} tokens")


@exercise("attend_with_cache")
def test_attend_with_cache_holds_every_token(submission, bugs, inputs):
    """after each step the cache holds the keys and values of every token so far"""
    x = inputs.randn(2, 6, 8)
    weights = _weights(inputs, 8, 8, 4, 8)
    all_k, all_v = oracles.keys_and_values(x, 2, weights[1], weights[2])  # (B, H, T, d)
    for _, stop, _, (k, v), call, lookalikes in _decode(submission, x, 2, weights, (3, 1, 2), bugs):
        expect_close(k, all_k[:, :, :stop], f"the key cache returned by {call}",
                     lookalikes=_at(lookalikes, 1, 0),
                     reference=f"the keys of tokens 0..{stop - 1}, x @ w_k.T split into heads")
        expect_close(v, all_v[:, :, :stop], f"the value cache returned by {call}",
                     lookalikes=_at(lookalikes, 1, 1),
                     reference=f"the values of tokens 0..{stop - 1}, x @ w_v.T split into heads")


# -- every exercise -----------------------------------------------------------------------

# A mask built without device= lives on the CPU and breaks on a GPU; the
# worker's device tracking shows that on any machine.
test_would_run_on_a_gpu = portability_check([
    portable("causal_mask", lambda inputs: ((4, 6), {"device": "cpu"})),
    portable("causal_self_attention", lambda inputs: (
        (inputs.randn(2, 5, 8), 2, *_weights(inputs, 8, 8, 8, 8)),
        {"lengths": torch.tensor([5, 3])})),
    portable("attend_with_cache", lambda inputs: (
        (inputs.randn(2, 2, 8), 2, *_weights(inputs, 8, 8, 8, 8)),
        {"cache": _random_cache(inputs, 2, 3, 2, 8, 8)})),
])
