"""Hidden checks for chapter 12: multi-head latent attention.

``MultiHeadLatentAttention`` is loaded with random weights (by the
``state_dict`` names of its docstring) and compared with the reference and
with an oracle written head by head (``F.linear`` on each head's rows of
the up-projections, RoPE as complex numbers,
``F.scaled_dot_product_attention(is_causal=True)`` with the scale
``1 / sqrt(d_h + d_R)``), on shapes where a head's width is not ``D / H``
and the latent is wider or narrower than a head. With the rope weights
zero, MLA must be the multi-head attention of the products of its low-rank
weights: no position may enter the content scores. Changing the last token
may change no earlier output, and the parameters must have the paper's
shapes (one rope key a token, ``k_rope`` ``(d_R, D)``).

``absorbed_decode`` gets the student's own module (``ModuleCall``'s
``passed_to``) and a cache of latents and rotated rope keys made by the
oracle; its output must be the row of the whole sequence's, and the cache it
returns exactly the latents and rope keys of every token, no per-head key or
value. Fed token by token with the caches it returns, from an empty cache, it
must give every row of the whole sequence. One case has ``d_c == d_h``, where
an absorbed ``W_UK`` the wrong way round gives numbers rather than an error.

``latent_cache_bytes`` is checked against the formula written out, against
the reference, against chapter 6's multi-head cache for DeepSeek-V2's
dimensions (576 numbers a token a layer against 32768), and for not
depending on the number or width of the heads.
"""

import pytest
import torch

from grader.checks import (
    NO_KEY,
    Oracles,
    case_ids,
    exercise,
    expect_int,
    expect_finite,
    expect_gradients,
    expect_module_matches_reference,
    portability_check,
    portable,
    reference_module_call,
    run,
    run_module,
)
from grader.compare import (
    describe,
    expect_close,
    expect_true,
    fail,
    matches,
    matching_hint,
    note,
    shape_text,
    unpack,
)
from grader.module_calls import ModuleCall

# MLA head by head with PyTorch's attention, its cache, the cache sizes (oracles.py).
oracles = Oracles("ch12")

INIT = ("d_model", "num_heads", "head_dim", "rope_dim", "kv_rank", "q_rank")


def _state(inputs, d_model, num_heads, head_dim, rope_dim, kv_rank, q_rank) -> dict:
    """Random weights in the course's names, scaled like nn.Linear's so softmaxes stay soft."""
    shapes = {"q_down": (q_rank, d_model), "q_up": (num_heads * head_dim, q_rank),
              "q_rope": (num_heads * rope_dim, q_rank), "kv_down": (kv_rank, d_model),
              "k_up": (num_heads * head_dim, kv_rank), "v_up": (num_heads * head_dim, kv_rank),
              "k_rope": (rope_dim, d_model), "out_proj": (d_model, num_heads * head_dim)}
    return {f"{name}.weight": inputs.randn(*shape) / shape[1] ** 0.5 for name, shape in shapes.items()}


def _recipe(state: dict, dims, **options) -> ModuleCall:
    return ModuleCall(init_kwargs=dict(zip(INIT, dims)), state=state, **options)


# -- MultiHeadLatentAttention -----------------------------------------------------------------

# (id, B, T, (D, H, d_h, d_R, d_c, d_c')): d_h need not be D / H; d_c below, above and equal to d_h.
MLA_CASES = [
    ("B2-T5-D16-H4-dh4-dR4-dc6-dq8", 2, 5, (16, 4, 4, 4, 6, 8)),
    ("B1-T6-D12-H3-dh4-dR2-dc4-dq6", 1, 6, (12, 3, 4, 2, 4, 6)),
    ("B2-T4-D8-H2-dh6-dR2-dc10-dq4", 2, 4, (8, 2, 6, 2, 10, 4)),
    ("B1-T7-D16-H1-dh8-dR4-dc12-dq8-one-head", 1, 7, (16, 1, 8, 4, 12, 8)),
    ("B2-T1-D8-H2-dh4-dR2-dc6-dq6-one-token", 2, 1, (8, 2, 4, 2, 6, 6)),
]


def _mla_inputs(inputs, case):
    """``(x, state, recipe)`` for a case of MLA_CASES."""
    _, batch, length, dims = case
    x = inputs.randn(batch, length, dims[0])
    state = _state(inputs, *dims)
    return x, state, _recipe(state, dims)


@exercise("MultiHeadLatentAttention")
@pytest.mark.parametrize("case", MLA_CASES, ids=case_ids(MLA_CASES))
def test_mla_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference loaded with the same weights"""
    x, _, recipe = _mla_inputs(inputs, case)
    expect_module_matches_reference(submission, reference, bugs, "MultiHeadLatentAttention", recipe, x)


@exercise("MultiHeadLatentAttention")
@pytest.mark.parametrize("case", MLA_CASES[:3], ids=case_ids(MLA_CASES[:3]))
def test_mla_matches_pytorch(submission, bugs, inputs, case):
    """equals each head's [q_C; RoPE(q_R)] and [k_C; RoPE(k_R)] in F.scaled_dot_product_attention(is_causal=True, scale=1/sqrt(d_h + d_R))"""
    x, state, recipe = _mla_inputs(inputs, case)
    got, call = run_module(submission, "MultiHeadLatentAttention", recipe, x)
    expect_close(got, oracles.mla(state, x), call, lookalikes=bugs.module("MultiHeadLatentAttention", recipe, x),
                 reference="F.linear on each head's rows, RoPE as complex numbers on the rope parts alone, "
                           "F.scaled_dot_product_attention(is_causal=True, scale=1/sqrt(d_h + d_R))")


@exercise("MultiHeadLatentAttention")
def test_mla_without_rope_weights_is_attention_of_the_weight_products(submission, bugs, inputs):
    """with q_rope and k_rope zero, is multi-head attention with W_UQ W_DQ, W_UK W_DKV, W_UV W_DKV (no position enters the content scores)"""
    _, batch, length, dims = MLA_CASES[0]
    x = inputs.randn(batch, length, dims[0])
    state = _state(inputs, *dims)
    state["q_rope.weight"] = torch.zeros_like(state["q_rope.weight"])
    state["k_rope.weight"] = torch.zeros_like(state["k_rope.weight"])
    recipe = _recipe(state, dims)
    got, call = run_module(submission, "MultiHeadLatentAttention", recipe, x)
    expect_close(got, oracles.mla_from_products(state, x), f"{call} with q_rope and k_rope zero",
                 lookalikes=bugs.module("MultiHeadLatentAttention", recipe, x),
                 reference="causal multi-head attention with the products of the low-rank weights, "
                           "scale 1/sqrt(d_h + d_R)")


@exercise("MultiHeadLatentAttention")
def test_mla_is_causal(submission, inputs):
    """changing the last token's input changes no earlier position's output"""
    x, _, recipe = _mla_inputs(inputs, MLA_CASES[0])
    changed = x.clone()
    changed[:, -1] = inputs.randn(x.shape[0], x.shape[-1])
    before, call = run_module(submission, "MultiHeadLatentAttention", recipe, x)
    after, _ = run_module(submission, "MultiHeadLatentAttention", recipe, changed)
    for got in (before, after):
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(x.shape):
            fail(f"{call} returned {describe(got)}; expected shape {shape_text(x.shape)}")
        expect_finite(got[:, :-1], f"{call} at the positions before the last", NO_KEY)
    moved = float((before[:, :-1] - after[:, :-1]).abs().amax())
    if not moved <= 1e-5:
        fail(f"{call}: changing only the last token's input changed the outputs at earlier positions (by up "
             f"to {moved:.3g}); token t may attend to tokens 0 .. t only: is the causal mask missing?")


@exercise("MultiHeadLatentAttention")
def test_mla_parameters(submission, inputs):
    """has q_down (d_c', D), q_up (H*d_h, d_c'), q_rope (H*d_R, d_c'), kv_down (d_c, D), k_up and v_up (H*d_h, d_c), k_rope (d_R, D), out_proj (D, H*d_h), no biases"""
    dims = (12, 3, 5, 2, 7, 9)  # D, H, d_h, d_R, d_c, d_c': every width distinct
    recipe = ModuleCall(init_kwargs=dict(zip(INIT, dims)), return_state=True)
    got, call = run_module(submission, "MultiHeadLatentAttention", recipe, inputs.randn(2, 3, 12))
    _, state = unpack(got, ("output", "state"), call)
    if not isinstance(state, dict):
        fail(f"{call}: could not read the module's state_dict")
    expected = {name: tuple(value.shape) for name, value in _state(inputs, *dims).items()}

    def listing(shapes: dict) -> str:
        return ", ".join(f"{name} {shape_text(shape)}" for name, shape in sorted(shapes.items()))

    found = {name: tuple(value.shape) for name, value in state.items() if hasattr(value, "shape")}
    per_head = " (one rope key a token, shared by the heads: d_R rows)" if found.get("k_rope.weight") == (6, 12) else ""
    expect_true(found == expected, f"{recipe.text('MultiHeadLatentAttention')} has parameters "
                f"{listing(found) or 'none'}; expected {listing(expected)}{per_head}")


@exercise("MultiHeadLatentAttention")
def test_mla_gradient(submission, inputs):
    """has the gradient of the head-by-head oracle with respect to x (autograd)"""
    x, state, recipe = _mla_inputs(inputs, MLA_CASES[2])
    upstream = inputs.randn(*x.shape)
    grad = {"wrt": [0], "output": None, "grad_output": upstream}
    got, grads = submission.call("MultiHeadLatentAttention", (x,), {}, grad=grad, module=recipe)
    call = submission.call_text("MultiHeadLatentAttention", (x,), {}, module=recipe)
    expect_close(got, oracles.mla(state, x), call, reference="PyTorch")
    expect_gradients(grads, [oracles.mla_gradient(state, x, upstream)], ("x",), call)


# -- absorbed_decode ----------------------------------------------------------------------------

# (id, B, T_past, dims): T_past 0 is a call without a cache; one case with d_c == d_h.
DECODE_CASES = [
    ("B2-past0-D16-H4-dh4-dR4-dc6-no-cache", 2, 0, (16, 4, 4, 4, 6, 8)),
    ("B2-past4-D16-H4-dh4-dR4-dc6", 2, 4, (16, 4, 4, 4, 6, 8)),
    ("B1-past3-D12-H3-dh4-dR2-dc4-square", 1, 3, (12, 3, 4, 2, 4, 6)),
    ("B2-past5-D8-H2-dh6-dR2-dc10", 2, 5, (8, 2, 6, 2, 10, 4)),
]


def _decode_inputs(inputs, case):
    """``(x, state, recipe, args)``: the whole sequence ``(B, T_past + 1, D)``, the
    weights, the recipe handing the module to absorbed_decode, and its arguments
    (the last token, and the oracle's cache of the earlier ones)."""
    _, batch, past, dims = case
    x = inputs.randn(batch, past + 1, dims[0])
    state = _state(inputs, *dims)
    recipe = _recipe(state, dims, passed_to="absorbed_decode")
    if past == 0:
        return x, state, recipe, (x[:, past:],)
    latent, rope_keys = oracles.latent_cache(state, x[:, :past])
    return x, state, recipe, (x[:, past:], (latent, rope_keys))


def _expect_cache(answer, expected: tuple, what: str, lookalikes, heads: int,
                  reference: str = "the oracle's latents c_KV and rope keys rotated at their positions, "
                                   "earlier tokens first") -> None:
    """The cache ``answer[1]`` (``(latent, rope_keys)``) equal to ``expected``, shapes first."""
    got = answer[1]
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(f"{what} is {describe(got)}; expected a tuple (latent, rope_keys) of (B, T, d_c) and (B, T, d_R) "
             f"tensors", hint=matching_hint(answer, lookalikes))
    for index, (name, width) in enumerate((("latent", "d_c"), ("rope keys", "d_R"))):
        value, right = got[index], expected[index]
        if isinstance(value, torch.Tensor) and tuple(value.shape) != tuple(right.shape):
            wide = value.dim() == 4 or (heads > 1 and value.shape[-1] % heads == 0
                                         and value.shape[-1] > right.shape[-1])
            per_head = (" (are these per-head keys or values? MLA caches the latent and the one rope key alone)"
                        if wide else "")
            fail(f"the {name} of {what} have shape {shape_text(value.shape)}, expected "
                 f"{shape_text(right.shape)}, (B, T_past + 1, {width}){per_head}",
                 hint=matching_hint(answer, lookalikes))
        expect_close(value, right, f"the {name} of {what}", lookalikes=_whole(lookalikes, answer, 1, index),
                     reference=reference)


def _whole(lookalikes, got, *path):
    """The known bugs (and the relations' variants and edits) whose whole answer,
    output and cache, is ``got``, each with ``got``'s part at ``path``, as
    ``expect_close`` takes them: a bug that gives the same cache with another
    output is not this mistake, nor one that gives the same output with another cache."""
    def outputs():
        for hint, output in lookalikes():
            if matches(got, output):
                part = got
                for index in path:
                    part = part[index]
                yield hint, part
    return outputs


@exercise("absorbed_decode")
@pytest.mark.parametrize("case", DECODE_CASES, ids=case_ids(DECODE_CASES))
def test_decode_step_gives_the_last_row(submission, bugs, inputs, case):
    """absorbed_decode(module, x, cache) gives the row T_past of the module on the whole sequence"""
    x, state, recipe, args = _decode_inputs(inputs, case)
    got, call = run_module(submission, "MultiHeadLatentAttention", recipe, *args)
    lookalikes = bugs.module("MultiHeadLatentAttention", recipe, *args)
    output, _ = unpack(got, ("output", "cache"), call)
    past = x.shape[1] - 1
    expected = oracles.mla(state, x)[:, past:]
    expect_close(output, expected, f"output of {call}", lookalikes=_whole(lookalikes, got, 0),
                 reference=f"the last row of MLA on all {past + 1} tokens (head by head, "
                           f"F.scaled_dot_product_attention)")


@exercise("absorbed_decode")
@pytest.mark.parametrize("case", DECODE_CASES[:3], ids=case_ids(DECODE_CASES[:3]))
def test_decode_cache_holds_the_latent_and_rope_key_only(submission, bugs, inputs, case):
    """returns the cache (latent (B, T_past + 1, d_c), rope keys (B, T_past + 1, d_R)): the new token's c_KV and RoPE(W_KR h) appended, nothing per head"""
    x, state, recipe, args = _decode_inputs(inputs, case)
    got, call = run_module(submission, "MultiHeadLatentAttention", recipe, *args)
    lookalikes = bugs.module("MultiHeadLatentAttention", recipe, *args)
    unpack(got, ("output", "cache"), call)
    _expect_cache(got, oracles.latent_cache(state, x), f"the cache {call} returned", lookalikes, heads=case[3][1])


@exercise("absorbed_decode")
def test_decode_token_by_token_gives_every_row(submission, inputs):
    """fed one token at a time from no cache, each time with the cache it returned, gives every row of the whole sequence"""
    batch, length, dims = 2, 6, (16, 4, 4, 4, 6, 8)
    x = inputs.randn(batch, length, dims[0])
    state = _state(inputs, *dims)
    recipe = _recipe(state, dims, passed_to="absorbed_decode")
    expected = oracles.mla(state, x)  # (B, T, D)
    cache = None
    for step in range(length):
        args = (x[:, step:step + 1],) if cache is None else (x[:, step:step + 1], cache)
        got, call = run_module(submission, "MultiHeadLatentAttention", recipe, *args)
        output, cache = unpack(got, ("output", "cache"), call)
        where = f"{call}, after tokens 0 .. {step - 1} went in through the caches it returned," if step else call
        # No known bug's hint: the calls after the first carry your own cache, which the
        # student edition cannot have recorded the bugs' answers for (the other checks name them).
        expect_close(output, expected[:, step:step + 1], where,
                     reference=f"row {step} of MLA on the whole sequence (PyTorch's attention)")


# A long cache, and latents half a head wide: every cached token's keys for every head,
# (B, T, H * d_h), hold twice the numbers of the latents broadcast to every head,
# (B, H, T, d_c), the largest tensor an absorbed decode may make.
LONG_PAST, LONG_DIMS = 255, (32, 8, 16, 4, 8, 16)  # D, H, d_h, d_R, d_c, d_c'


@exercise("absorbed_decode")
def test_decode_never_up_projects_the_cache(submission, inputs):
    """never makes every cached token's keys or values for every head (a note, from the worker's own measure: it costs no point)"""
    x = inputs.randn(1, LONG_PAST + 1, LONG_DIMS[0])
    state = _state(inputs, *LONG_DIMS)
    recipe = _recipe(state, LONG_DIMS, passed_to="absorbed_decode")
    args = (x[:, LONG_PAST:], oracles.latent_cache(state, x[:, :LONG_PAST]))
    (got, footprint) = submission.call("MultiHeadLatentAttention", args, {}, module=recipe, measure=True)
    call = submission.call_text("MultiHeadLatentAttention", args, {}, module=recipe)
    output, _ = unpack(got, ("output", "cache"), call)
    expect_close(output, oracles.mla(state, x)[:, LONG_PAST:], f"output of {call}",
                 reference=f"the last row of MLA on all {LONG_PAST + 1} tokens")
    largest = footprint.largest
    _, heads, head_dim, _, _, _ = LONG_DIMS
    if largest.numel >= (LONG_PAST + 1) * heads * head_dim:
        where = f" at {submission.submission.where(largest.line)}" if largest.line else ""
        note(f"{call} made a {shape_text(largest.shape)} tensor{where}, as large as the keys (or values) of "
             f"all {LONG_PAST + 1} tokens for all {heads} heads: the absorbed decode scores the latents with "
             f"q_C W_UK_h and sums them before W_UV_h, never up-projecting a cached latent", moot_if_failed=True)


@exercise("absorbed_decode")
@pytest.mark.parametrize("case", DECODE_CASES[1:], ids=case_ids(DECODE_CASES[1:]))
def test_decode_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference: the output and the cache"""
    _, _, recipe, args = _decode_inputs(inputs, case)
    got, call = run_module(submission, "MultiHeadLatentAttention", recipe, *args)
    lookalikes = bugs.module("MultiHeadLatentAttention", recipe, *args)
    output, _ = unpack(got, ("output", "cache"), call)
    with torch.no_grad():  # the reference's module holds parameters that require gradients
        expected_output, expected_cache = reference_module_call(reference, "MultiHeadLatentAttention", recipe,
                                                                *args)
    expect_close(output, expected_output, f"output of {call}", lookalikes=_whole(lookalikes, got, 0))
    _expect_cache(got, expected_cache, f"the cache {call} returned", lookalikes, heads=case[3][1],
                  reference="the reference's")


# -- latent_cache_bytes --------------------------------------------------------------------------

# (id, batch, seq_len, layers, H, d_h, d_c, d_R, dtype): DeepSeek-V2 (60 layers, 128 heads of
# 128, d_c = 512, d_R = 64), DeepSeek-V2-Lite-like (27 layers, 16 heads), small ones, int8.
CACHE_CASES = [
    ("deepseek-v2-B1-T1-bf16", 1, 1, 60, 128, 128, 512, 64, torch.bfloat16),
    ("deepseek-v2-B8-T4096-bf16", 8, 4096, 60, 128, 128, 512, 64, torch.bfloat16),
    ("lite-B2-T1000-fp16", 2, 1000, 27, 16, 128, 512, 64, torch.float16),
    ("B3-T10-L2-H4-dh16-dc24-dR8-fp32", 3, 10, 2, 4, 16, 24, 8, torch.float32),
    ("B2-T7-L5-H3-dh8-dc12-dR4-int8", 2, 7, 5, 3, 8, 12, 4, torch.int8),
    ("B1-T1-L1-H1-dh2-dc3-dR2-fp64", 1, 1, 1, 1, 2, 3, 2, torch.float64),
]


@exercise("latent_cache_bytes")
@pytest.mark.parametrize("case", CACHE_CASES, ids=case_ids(CACHE_CASES))
def test_cache_bytes_follow_the_formula(submission, bugs, case):
    """equals batch x seq_len x layers x (d_c + d_R) x bytes per number"""
    args = case[1:]
    got, call = run(submission, "latent_cache_bytes", *args)
    expect_int(got, oracles.cache_bytes(*args), call, bugs.latent_cache_bytes(*args),
                  f"B x T x layers x (d_c + d_R) x {args[-1].itemsize} bytes")


@exercise("latent_cache_bytes")
@pytest.mark.parametrize("case", CACHE_CASES[1::2], ids=case_ids(CACHE_CASES[1::2]))
def test_cache_bytes_match_reference(submission, reference, bugs, case):
    """matches the reference"""
    args = case[1:]
    got, call = run(submission, "latent_cache_bytes", *args)
    expect_int(got, reference.latent_cache_bytes(*args), call, bugs.latent_cache_bytes(*args), "the reference")


@exercise("latent_cache_bytes")
def test_cache_is_576_of_mhas_32768_numbers_for_deepseek_v2(submission, bugs):
    """for DeepSeek-V2 (128 heads of 128, d_c = 512, d_R = 64) is 576 / 32768 of chapter 6's multi-head KV cache"""
    args = (1, 4096, 60, 128, 128, 512, 64, torch.bfloat16)
    got, call = run(submission, "latent_cache_bytes", *args)
    mha = oracles.mha_cache_bytes(1, 4096, 60, 128, 128, torch.bfloat16)
    expect_int(got, mha * 576 // 32768, call, bugs.latent_cache_bytes(*args),
                  f"576 / 32768 of multi-head attention's {mha} bytes (chapter 6: 2 x H x d_h = 32768 numbers a "
                  f"token a layer; MLA: d_c + d_R = 576)")


@exercise("latent_cache_bytes")
def test_cache_bytes_do_not_depend_on_the_heads(submission, bugs):
    """is the same for 1, 8 or 128 heads, of width 64 or 128: only the latent and the rope key are cached"""
    for num_heads, head_dim in ((1, 64), (8, 128), (128, 128)):
        args = (2, 100, 4, num_heads, head_dim, 512, 64, torch.bfloat16)
        got, call = run(submission, "latent_cache_bytes", *args)
        expect_int(got, oracles.cache_bytes(*args), call, bugs.latent_cache_bytes(*args),
                      "the same for every number of heads: B x T x layers x (d_c + d_R) x 2 bytes")


# -- every exercise -----------------------------------------------------------------------------

# A tensor made without device= stays on the CPU on a GPU machine; the
# worker's device tracking shows where, on any machine.
test_would_run_on_a_gpu = portability_check([
    portable("MultiHeadLatentAttention", lambda inputs: (
        (inputs.randn(2, 5, 16),), {"module": _mla_inputs(inputs, MLA_CASES[0])[2]})),
    pytest.param("MultiHeadLatentAttention", lambda inputs: (
        (inputs.randn(2, 1, 16), (inputs.randn(2, 4, 6), inputs.randn(2, 4, 4))),
        {"module": _recipe(_state(inputs, *DECODE_CASES[1][3]), DECODE_CASES[1][3], passed_to="absorbed_decode")}),
        marks=exercise("absorbed_decode"), id="absorbed_decode"),
    portable("latent_cache_bytes", lambda inputs: ((2, 16, 4, 2, 8, 12, 4, torch.bfloat16), {})),
])
