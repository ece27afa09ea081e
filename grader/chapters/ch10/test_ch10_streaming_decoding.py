"""Hidden checks for chapter 10: bounded-memory decoding with a sliding
window, a rolling buffer and attention sinks.

``sliding_window_mask`` is compared with the reference and with a mask
built entry by entry (oracles.py), for windows of 1, narrower and wider
than the keys, with and without sinks, unequal query and key lengths; a
window as wide as the keys without sinks must be chapter 4's causal mask.
``rolling_cache_append`` is compared with the reference and with a replay
of the buffer's evictions (a list of held tokens, the oldest non-sink one
replaced), for counts before the buffer fills, at its first wrap, after many
turns and in the billions; then a whole stream of tokens, each key holding
its token's number, is appended through the student's own buffers and the
slots are read back as token numbers. ``streaming_attention_step`` is
compared step by step with the reference and with a recomputation from the
whole text (PyTorch's attention under the sink-plus-window mask without
RoPE; the visible tokens gathered in text order and rotated at positions
``0 .. n - 1`` with it, StreamingLLM's rule), for streams several times
longer than the buffer, fed the student's own buffers back; the returned
buffers must keep their shape at every step; a buffer wider than the text
must give chapter 4's causal attention with RoPE at text positions. One
step at token 10^9 + 7 runs in a worker that may map 16 MiB (the kernel
counts it, ``run_within``): memory that grows with the tokens decoded fails.

On a mismatch, the known bugs run on the same inputs (the right buffers,
never the student's, so that their answers depend on the check's inputs
alone) and a matching one's hint goes with the failure.
"""

import pytest
import torch

from grader.checks import (
    Oracles,
    case_ids,
    exercise,
    expect_mask,
    portability_check,
    portable,
    run,
    run_within,
)
from grader.compare import (
    CheckFailure,
    describe,
    expect_close,
    expect_like,
    fail,
    unpack,
)
from grader.outcomes import Failure

# The mask entry by entry, the buffer by replaying its evictions, decoding
# recomputed from the whole text (oracles.py).
oracles = Oracles("ch10")

MEMORY_BUDGET = 16 * 2**20  # bytes a step may map beyond the worker's start; the reference needs under 1 MiB
HUGE_COUNT = 10**9 + 7  # tokens decoded before a step: a tensor of that many int64 is 8 GB


# -- helpers -------------------------------------------------------------------------


def _at(lookalikes, *path):
    """The lookalikes' values at ``path`` inside their tuple answers."""
    def values():
        for hint, value in lookalikes():
            try:
                for index in path:
                    value = value[index]
            except (TypeError, IndexError):
                continue
            yield hint, value
    return values


def _pair(got, call: str, names=("k_cache", "v_cache")):
    return unpack(got, names, call)


def _weights(inputs, d_model, dim_qk, dim_v, d_out, dtype=torch.float32):
    """w_q, w_k, w_v, w_o in nn.Linear layout, scaled so activations stay near 1."""
    shapes = ((dim_qk, d_model), (dim_qk, d_model), (dim_v, d_model), (d_out, dim_v))
    return [(inputs.randn(*shape, dtype=torch.float64) / shape[1] ** 0.5).to(dtype) for shape in shapes]


def _buffer_text(capacity: int, sinks: int) -> str:
    return f"a buffer of {capacity} slots ({sinks} sink{'s' if sinks != 1 else ''}, a window of {capacity - sinks})"


# -- sliding_window_mask -------------------------------------------------------------

# (id, L, S, window, sinks)
MASK_CASES = [
    ("L7-W3", 7, 7, 3, 0),
    ("L7-W3-sinks2", 7, 7, 3, 2),
    ("L1-S9-W4-sinks2-one-step", 1, 9, 4, 2),
    ("L3-S8-W2-sinks1-chunk", 3, 8, 2, 1),
    ("L5-W1-itself-only", 5, 5, 1, 0),
    ("L6-S3-W2-more-queries", 6, 3, 2, 1),
    ("L6-W10-wider-than-the-keys", 6, 6, 10, 0),
    ("L8-W2-sinks4", 8, 8, 2, 4),
]


@exercise("sliding_window_mask")
@pytest.mark.parametrize("case", MASK_CASES, ids=case_ids(MASK_CASES))
def test_sliding_window_mask_matches_reference(submission, reference, bugs, case):
    """matches the reference: windows of 1 to more than the keys, sinks, L != S"""
    _, num_queries, num_keys, window, sinks = case
    got, call = run(submission, "sliding_window_mask", num_queries, num_keys, window, sinks)
    expect_mask(got, reference.sliding_window_mask(num_queries, num_keys, window, sinks), call,
                 lookalikes=bugs.sliding_window_mask(num_queries, num_keys, window, sinks))


@exercise("sliding_window_mask")
@pytest.mark.parametrize("case", MASK_CASES[1:6], ids=case_ids(MASK_CASES[1:6]))
def test_sliding_window_mask_equals_the_rule(submission, case):
    """lets query i (at position p = i + S - L) see key j when j <= p and (j > p - W or j < sinks)"""
    _, num_queries, num_keys, window, sinks = case
    got, call = run(submission, "sliding_window_mask", num_queries, num_keys, window, sinks=sinks)
    expect_mask(got, oracles.sliding_window_mask(num_queries, num_keys, window, sinks), call,
                 reference="the rule checked key by key")


@exercise("sliding_window_mask")
@pytest.mark.parametrize("shape", [(5, 5), (2, 6), (6, 2)], ids=["L5", "L2-S6", "L6-S2"])
def test_sliding_window_mask_as_wide_as_the_keys_is_causal(submission, shape):
    """with a window as wide as the keys and no sinks, is chapter 4's bottom-right causal mask"""
    num_queries, num_keys = shape
    got, call = run(submission, "sliding_window_mask", num_queries, num_keys, num_keys)
    expect_mask(got, oracles.causal_mask(num_queries, num_keys), call,
                 reference="chapter 4's causal mask (tril with offset S - L)")


# -- rolling_cache_append ------------------------------------------------------------

# (id, B, H, C, d, d_v, count, sinks)
APPEND_CASES = [
    ("first-token", 2, 2, 6, 4, 3, 0, 2),
    ("filling-count3", 2, 2, 6, 4, 3, 3, 2),
    ("last-free-slot", 1, 2, 6, 4, 4, 5, 2),
    ("first-wrap", 2, 1, 6, 4, 3, 6, 2),
    ("many-turns", 2, 2, 6, 2, 3, 29, 2),
    ("mistral-no-sinks", 2, 2, 5, 4, 3, 13, 0),
    ("ring-of-one", 1, 3, 4, 2, 2, 9, 3),
    ("count-in-the-billions", 1, 2, 7, 4, 3, HUGE_COUNT, 3),
]


def _append_inputs(inputs, batch, heads, capacity, dim, dim_v):
    return (inputs.randn(batch, heads, capacity, dim), inputs.randn(batch, heads, capacity, dim_v),
            inputs.randn(batch, heads, 1, dim), inputs.randn(batch, heads, 1, dim_v))


@exercise("rolling_cache_append")
@pytest.mark.parametrize("case", APPEND_CASES, ids=case_ids(APPEND_CASES))
def test_rolling_cache_append_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference: before the buffer fills, at its first wrap, after many turns"""
    _, batch, heads, capacity, dim, dim_v, count, sinks = case
    args = _append_inputs(inputs, batch, heads, capacity, dim, dim_v)
    got, call = run(submission, "rolling_cache_append", *args, count, sinks)
    k, v = _pair(got, call)
    lookalikes = bugs.rolling_cache_append(*args, count, sinks)
    expected_k, expected_v = reference.rolling_cache_append(*args, count, sinks)
    expect_close(k, expected_k, f"the key buffer returned by {call}", lookalikes=_at(lookalikes, 0))
    expect_close(v, expected_v, f"the value buffer returned by {call}", lookalikes=_at(lookalikes, 1))


@exercise("rolling_cache_append")
@pytest.mark.parametrize("case", APPEND_CASES[2:], ids=case_ids(APPEND_CASES[2:]))
def test_rolling_cache_append_replaces_the_oldest_token(submission, bugs, inputs, case):
    """writes token count where a replay of the evictions puts it: a free slot, else the oldest token after the sinks"""
    _, batch, heads, capacity, dim, dim_v, count, sinks = case
    args = _append_inputs(inputs, batch, heads, capacity, dim, dim_v)
    got, call = run(submission, "rolling_cache_append", *args, count, sinks=sinks)
    k, v = _pair(got, call)
    lookalikes = bugs.rolling_cache_append(*args, count, sinks=sinks)
    expected_k, expected_v = oracles.rolling_cache_append(*args, count, sinks)
    reference = "the buffers with token count in the slot of the token it replaces (a replay of the evictions)"
    expect_close(k, expected_k, f"the key buffer returned by {call}", lookalikes=_at(lookalikes, 0),
                 reference=reference)
    expect_close(v, expected_v, f"the value buffer returned by {call}", lookalikes=_at(lookalikes, 1),
                 reference=reference)


def _tokens_held(buffer: torch.Tensor) -> list:
    """The token numbers a buffer of numbered keys holds, slot by slot (None: no token's)."""
    values = buffer[0, 0, :, 0].tolist()
    return [round(value) - 1 if value >= 0.5 and abs(value - round(value)) < 1e-3 else None
            for value in values]


@exercise("rolling_cache_append")
@pytest.mark.parametrize("sinks", [2, 0], ids=["sinks2", "no-sinks"])
def test_rolling_cache_fills_in_order_then_evicts_the_oldest(submission, bugs, sinks):
    """appending 16 tokens to 6 slots through its own buffers: the sinks stay, the slots fill in order, then each new token replaces the oldest of the window"""
    capacity, length = 6, 16
    k_buffer, v_buffer = torch.zeros(1, 2, capacity, 3), torch.zeros(1, 2, capacity, 2)
    numbered_k = torch.arange(1.0, length + 1).repeat(1, 2, 3, 1).transpose(-2, -1)  # (1, 2, T, 3): token t is t + 1
    numbered_v = -numbered_k[..., :2]  # (1, 2, T, 2)
    for count in range(length):
        k_new, v_new = numbered_k[:, :, count:count + 1], numbered_v[:, :, count:count + 1]
        got, call = run(submission, "rolling_cache_append", k_buffer, v_buffer, k_new, v_new, count, sinks)
        k_buffer, v_buffer = _pair(got, call)
        right_k, right_v = oracles.rolling_buffer(numbered_k, numbered_v, count, capacity, sinks)
        lookalikes = bugs.rolling_cache_append(right_k, right_v, k_new, v_new, count, sinks)
        expected_k, expected_v = oracles.rolling_buffer(numbered_k, numbered_v, count + 1, capacity, sinks)
        what = f"after tokens 0..{count} were appended to {_buffer_text(capacity, sinks)}, the key buffer of {call}"
        expect_like(k_buffer, expected_k, what + " (it never grows)")
        expect_like(v_buffer, expected_v, what.replace("key buffer", "value buffer") + " (it never grows)")
        for buffer, expected, name, index in ((k_buffer, expected_k, "key", 0), (v_buffer, expected_v, "value", 1)):
            try:
                expect_close(buffer, expected, what.replace("key", name), lookalikes=_at(lookalikes, index),
                             reference="a replay of the evictions")
            except CheckFailure as failure:
                if failure.kind != Failure.MISMATCH:
                    raise
                sign = 1 if index == 0 else -1
                held = _tokens_held(sign * buffer.cpu())
                fail(f"{what.replace('key', name)}: its slots hold tokens {held}, expected "
                     f"{_tokens_held(sign * expected)}", hint=failure.hint)


# -- streaming_attention_step --------------------------------------------------------

# (id, B, H, d_model, D, D_v, d_out, C, count, sinks, theta)
STEP_CASES = [
    ("first-token", 2, 2, 8, 8, 6, 5, 6, 0, 2, 10000.0),
    ("filling-count3", 2, 2, 8, 8, 6, 5, 6, 3, 2, 10000.0),
    ("just-full", 1, 2, 8, 8, 8, 8, 6, 5, 2, 10000.0),
    ("wrapped-count20", 2, 2, 8, 8, 6, 5, 6, 20, 2, 100.0),
    ("wrapped-no-rope", 2, 2, 8, 8, 6, 5, 6, 20, 2, None),
    ("mistral-no-sinks", 2, 1, 6, 6, 4, 6, 5, 12, 0, 10000.0),
    ("H3-d4-sinks1", 1, 3, 6, 12, 6, 4, 7, 17, 1, 500.0),
]


def _step_inputs(inputs, batch, heads, d_model, dim_qk, dim_v, d_out, capacity, dtype=torch.float32):
    x = inputs.randn(batch, 1, d_model, dtype=dtype)
    weights = _weights(inputs, d_model, dim_qk, dim_v, d_out, dtype=dtype)
    # Slots not yet written hold anything: random values, so that attending to them shows.
    k_cache = inputs.randn(batch, heads, capacity, dim_qk // heads, dtype=dtype)
    v_cache = inputs.randn(batch, heads, capacity, dim_v // heads, dtype=dtype)
    return x, heads, weights, k_cache, v_cache


def _split_step(got, call):
    output, cache = unpack(got, ("output", "cache"), call)
    if not (isinstance(cache, (tuple, list)) and len(cache) == 2):
        fail(f"{call} returned the cache as {describe(cache)}, expected a tuple (k_cache, v_cache) of tensors "
             "(B, H, C, ·), the buffers passed in after the append")
    return output, cache[0], cache[1]


def _expect_step(got, expected, call, lookalikes, reference="the reference"):
    output, k, v = _split_step(got, call)
    expected_output, (expected_k, expected_v) = expected
    expect_close(k, expected_k, f"the key buffer returned by {call}", lookalikes=_at(lookalikes, 1, 0),
                 reference=reference)
    expect_close(v, expected_v, f"the value buffer returned by {call}", lookalikes=_at(lookalikes, 1, 1),
                 reference=reference)
    expect_close(output, expected_output, f"output of {call}", lookalikes=_at(lookalikes, 0), reference=reference)


@exercise("streaming_attention_step")
@pytest.mark.parametrize("case", STEP_CASES, ids=case_ids(STEP_CASES))
def test_streaming_step_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference: output and returned buffers, before and after the buffer wraps"""
    _, batch, heads, d_model, dim_qk, dim_v, d_out, capacity, count, sinks, theta = case
    x, heads, weights, k_cache, v_cache = _step_inputs(inputs, batch, heads, d_model, dim_qk, dim_v, d_out, capacity)
    args = (x, heads, *weights, k_cache, v_cache, count, sinks, theta)
    got, call = run(submission, "streaming_attention_step", *args)
    _expect_step(got, reference.streaming_attention_step(*args), call, bugs.streaming_attention_step(*args))


@exercise("streaming_attention_step")
@pytest.mark.parametrize("case", STEP_CASES[1:], ids=case_ids(STEP_CASES[1:]))
def test_streaming_step_attends_to_the_held_tokens_at_cache_positions(submission, bugs, inputs, case):
    """attends to the tokens the buffer holds, rotated at their positions within the cache (0 .. n - 1 in text order), float64"""
    _, batch, heads, d_model, dim_qk, dim_v, d_out, capacity, count, sinks, theta = case
    x, heads, weights, k_cache, v_cache = _step_inputs(inputs, batch, heads, d_model, dim_qk, dim_v, d_out, capacity,
                                                       dtype=torch.float64)
    args = (x, heads, *weights, k_cache, v_cache, count)
    got, call = run(submission, "streaming_attention_step", *args, sinks=sinks, theta=theta)
    _expect_step(got, oracles.streaming_attention_step(*args, sinks, theta), call,
                 bugs.streaming_attention_step(*args, sinks=sinks, theta=theta),
                 reference="the held tokens, sorted by text position, at positions 0 .. n - 1 (PyTorch's attention)")


def _decode(submission, bugs, inputs, length, capacity, sinks, theta, num_heads=2, d_model=8, dim_v=6, d_out=5):
    """Decode ``length`` tokens one by one, each step fed the buffers the
    previous one returned; the buffers must keep their shape and hold what a
    replay says. Yields ``(t, output, call, lookalikes)`` and the inputs first."""
    x = inputs.randn(2, length, d_model)
    weights = _weights(inputs, d_model, d_model, dim_v, d_out)
    yield x, weights
    all_k, all_v = oracles.keys_and_values(x, num_heads, weights[1], weights[2])  # (B, H, T, ·)
    k_cache = torch.zeros(2, num_heads, capacity, d_model // num_heads)
    v_cache = torch.zeros(2, num_heads, capacity, dim_v // num_heads)
    for t in range(length):
        got, call = run(submission, "streaming_attention_step", x[:, t:t + 1], num_heads, *weights, k_cache, v_cache,
                        t, sinks, theta)
        call = f"step {t} of decoding {length} tokens with {_buffer_text(capacity, sinks)}, {call}"
        right_k, right_v = oracles.rolling_buffer(all_k, all_v, t, capacity, sinks)
        lookalikes = bugs.streaming_attention_step(x[:, t:t + 1], num_heads, *weights, right_k, right_v, t, sinks,
                                                   theta)
        output, k_cache, v_cache = _split_step(got, call)
        expected_k, expected_v = oracles.rolling_buffer(all_k, all_v, t + 1, capacity, sinks)
        expect_like(k_cache, expected_k, f"the key buffer returned by {call} (the buffer never grows)")
        expect_like(v_cache, expected_v, f"the value buffer returned by {call} (the buffer never grows)")
        expect_close(k_cache, expected_k, f"the key buffer returned by {call}", lookalikes=_at(lookalikes, 1, 0),
                     reference="the unrotated keys where a replay of the evictions puts them")
        expect_close(v_cache, expected_v, f"the value buffer returned by {call}", lookalikes=_at(lookalikes, 1, 1),
                     reference="the values where a replay of the evictions puts them")
        yield t, output, call, lookalikes


@exercise("streaming_attention_step")
@pytest.mark.parametrize("sinks", [2, 0], ids=["sinks2", "no-sinks"])
def test_decoding_equals_attention_under_the_sink_and_window_mask(submission, bugs, inputs, sinks):
    """without RoPE, decoding 18 tokens through a 6-slot buffer gives the rows of PyTorch's attention over the whole text under the sink-plus-window mask"""
    steps = _decode(submission, bugs, inputs, 18, 6, sinks, None)
    x, weights = next(steps)
    full = oracles.streaming_decode(x, 2, *weights, 6, sinks, None)  # (B, T, d_out)
    for t, output, call, lookalikes in steps:
        expect_close(output, full[:, t:t + 1], f"output of {call}", lookalikes=_at(lookalikes, 0),
                     reference=f"row {t} of F.scaled_dot_product_attention under "
                               f"sliding_window_mask(18, 18, {6 - sinks}, {sinks})")


@exercise("streaming_attention_step")
@pytest.mark.parametrize("theta", [10000.0, 100.0], ids=["theta10000", "theta100"])
def test_decoding_with_rope_rotates_at_positions_within_the_cache(submission, bugs, inputs, theta):
    """with RoPE, decoding 16 tokens through a 5-slot buffer with 2 sinks rotates the held tokens at 0 .. n - 1, as StreamingLLM"""
    steps = _decode(submission, bugs, inputs, 16, 5, 2, theta)
    x, weights = next(steps)
    full = oracles.streaming_decode(x, 2, *weights, 5, 2, theta)  # (B, T, d_out)
    for t, output, call, lookalikes in steps:
        expect_close(output, full[:, t:t + 1], f"output of {call}", lookalikes=_at(lookalikes, 0),
                     reference="attention over the visible tokens in text order, rotated at positions 0 .. n - 1")


@exercise("streaming_attention_step")
def test_a_buffer_wider_than_the_text_is_causal_attention(submission, bugs, inputs):
    """with a buffer wider than the text, decoding is chapter 4's causal attention with RoPE at text positions (chapter 5)"""
    steps = _decode(submission, bugs, inputs, 7, 9, 1, 10000.0)
    x, weights = next(steps)
    full = oracles.causal_rope_attention(x, 2, *weights, 10000.0)  # (B, T, d_out)
    for t, output, call, lookalikes in steps:
        expect_close(output, full[:, t:t + 1], f"output of {call}", lookalikes=_at(lookalikes, 0),
                     reference=f"row {t} of causal attention with RoPE at positions 0..6 (is_causal=True)")


@exercise("streaming_attention_step")
def test_a_step_needs_no_memory_for_the_tokens_already_decoded(submission, reference, bugs, inputs):
    """a step at token 10^9 + 7 with an 8-slot buffer needs no more than 16 MiB, as the kernel counts it: nothing grows with the tokens decoded"""
    x, heads, weights, k_cache, v_cache = _step_inputs(inputs, 1, 2, 8, 8, 6, 5, 8)
    args = (x, heads, *weights, k_cache, v_cache, HUGE_COUNT, 2, 10000.0)
    got, call = run_within(submission, MEMORY_BUDGET, "streaming_attention_step", *args,
                           hint="looks like a tensor as long as the text so far is built (an arange(count), a mask "
                                "over every token): a step must cost what the buffer holds, whatever count is")
    _expect_step(got, reference.streaming_attention_step(*args), call, bugs.streaming_attention_step(*args))


# -- every exercise -----------------------------------------------------------------------

test_would_run_on_a_gpu = portability_check([
    portable("sliding_window_mask", lambda inputs: ((4, 7, 3, 2), {"device": "cpu"})),
    portable("rolling_cache_append", lambda inputs: (
        (*_append_inputs(inputs, 2, 2, 6, 4, 3), 9, 2), {})),
    portable("streaming_attention_step", lambda inputs: (
        (inputs.randn(2, 1, 8), 2, *_weights(inputs, 8, 8, 6, 5), inputs.randn(2, 2, 6, 4),
         inputs.randn(2, 2, 6, 3), 9, 2, 10000.0), {})),
])
