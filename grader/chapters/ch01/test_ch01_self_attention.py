"""Hidden checks for chapter 1: softmax, scaled dot-product attention, self-attention.

Every exercise is checked four ways: against the reference solution on
several shapes, against PyTorch's own functions (an independent oracle),
against properties any correct answer has, and, on a mismatch, against known
wrong implementations, whose hint then goes with the failure.
"""

import numpy as np
import pytest
import torch

from grader.checks import (
    case_ids,
    exercise,
    expect_attention,
    expect_finite,
    expect_gradients,
    NO_KEY,
    Oracles,
    portability_check,
    portable,
    run,
    run_with_gradients,
)
from grader.compare import expect_close, expect_like, expect_true, fail, unpack

oracles = Oracles("ch01")

# (id, q shape, k shape, v shape): no batch dimension, one, two and three of
# them, L != S, d_v != d_k, a single query, and head width 1.
ATTENTION_CASES = [
    ("L4-S4-d8", (4, 8), (4, 8), (4, 8)),
    ("B2-L5-S7-d8-dv4", (2, 5, 8), (2, 7, 8), (2, 7, 4)),
    ("B2x3-L6-S3-d16-dv5", (2, 3, 6, 16), (2, 3, 3, 16), (2, 3, 3, 5)),
    ("B3-L1-S9-d1", (3, 1, 1), (3, 9, 1), (3, 9, 2)),
    ("B2x2x2-L3-S5-d4", (2, 2, 2, 3, 4), (2, 2, 2, 5, 4), (2, 2, 2, 5, 3)),
]
SOFTMAX_CASES = [  # (shape, dim)
    ((7,), -1),
    ((3, 5), -1),
    ((3, 5), 0),
    ((2, 3, 4, 6), 1),
    ((2, 1, 9), 2),
]


def _softmax_ids(cases):
    return [f"{'x'.join(map(str, shape))}-dim{dim}" for shape, dim in cases]


# -- softmax ---------------------------------------------------------------------


@exercise("softmax")
@pytest.mark.parametrize("shape, dim", SOFTMAX_CASES, ids=_softmax_ids(SOFTMAX_CASES))
def test_softmax_matches_reference(submission, reference, bugs, inputs, shape, dim):
    """matches the reference"""
    x = inputs.randn(*shape) * 3
    got, call = run(submission, "softmax", x, dim=dim)
    expect_close(got, reference.softmax(x, dim=dim), call, lookalikes=bugs.softmax(x, dim=dim))


@exercise("softmax")
def test_softmax_keeps_float64(submission, reference, inputs):
    """returns float64 for float64 inputs"""
    x = inputs.randn(4, 6, dtype=torch.float64)
    got, call = run(submission, "softmax", x, dim=-1)
    expect_close(got, reference.softmax(x, dim=-1), call)


@exercise("softmax")
@pytest.mark.parametrize("shape, dim", SOFTMAX_CASES[1:4], ids=_softmax_ids(SOFTMAX_CASES[1:4]))
def test_softmax_matches_pytorch(submission, inputs, shape, dim):
    """matches torch.softmax"""
    x = inputs.randn(*shape) * 3
    got, call = run(submission, "softmax", x, dim=dim)
    expect_close(got, torch.softmax(x, dim=dim), call, reference="torch.softmax")


@exercise("softmax")
def test_softmax_gives_probabilities(submission, inputs):
    """gives entries in [0, 1] that sum to 1 along dim"""
    x = inputs.randn(5, 8) * 4
    for dim in (0, 1):
        got, call = run(submission, "softmax", x, dim=dim)
        expect_like(got, x, call)  # a tensor of x's shape and dtype, then the properties
        expect_finite(got, call)
        expect_true(bool((got >= 0).all() and (got <= 1).all()),
                    f"{call} has entries outside [0, 1]")
        sums = got.sum(dim=dim)
        expect_true(torch.allclose(sums, torch.ones_like(sums), atol=1e-5),
                    f"{call} does not sum to 1 along dim={dim} (sums range from "
                    f"{float(sums.min()):.4g} to {float(sums.max()):.4g})")


@exercise("softmax")
@pytest.mark.parametrize("size", [1e2, 1e4], ids=["logits-1e2", "logits-1e4"])
def test_softmax_survives_huge_logits(submission, bugs, inputs, size):
    """stays finite for huge logits"""
    x = inputs.randn(4, 6) * size
    x[0] = torch.tensor([1000.0, 1001.0, 1002.0, -1000.0, 0.0, 3.0])
    got, call = run(submission, "softmax", x, dim=-1)
    expect_close(got, torch.softmax(x, dim=-1), f"{call} with entries as large as {x.abs().max():.0f}",
                 lookalikes=bugs.softmax(x, dim=-1), reference="torch.softmax")


@exercise("softmax")
def test_softmax_gives_zero_to_minus_infinity(submission, inputs):
    """gives exactly zero weight to -inf entries"""
    x = inputs.randn(4, 6)
    blocked = inputs.mask(4, 6, keep=0.4)  # True here marks the -inf entries
    blocked[:, 0] = False
    x = x.masked_fill(blocked, float("-inf"))
    got, call = run(submission, "softmax", x, dim=-1)
    expect_close(got, torch.softmax(x, dim=-1), f"{call} with -inf entries", reference="torch.softmax")
    expect_true(bool((got[blocked] == 0).all()), f"{call} gives -inf entries a non-zero weight")


def _expect_nan_where_all_minus_infinity(got, expected, call: str) -> None:
    """NaN along the slice that is all -inf (as torch.softmax gives), the
    reference's values elsewhere."""
    got_t, expected_t = (torch.as_tensor(value) for value in (got, expected))
    empty = torch.isnan(expected_t)
    wrong = got_t[empty][~torch.isnan(got_t[empty])]
    if wrong.numel():
        fail(f"{call} with a slice of -inf entries only gives {float(wrong[0]):.4g} there; the "
             "docstring asks for NaN (no entry is finite: there is no distribution)",
             summary=f"{float(wrong[0]):.4g} where the slice is all -inf, expected NaN")
    expect_close(got_t.masked_fill(empty, 0.0), expected_t.masked_fill(empty, 0.0),
                 f"{call}, outside the slice of -inf entries", reference="torch.softmax")


@exercise("softmax")
@pytest.mark.parametrize("dim", [-1, 0], ids=["row", "column"])
def test_softmax_of_a_slice_of_minus_infinity_is_nan(submission, inputs, dim):
    """gives NaN along a slice that is all -inf"""
    x = inputs.randn(3, 5)
    x.select(1 if dim == 0 else 0, 1).fill_(float("-inf"))  # row 1, or column 1
    got, call = run(submission, "softmax", x, dim=dim)
    expect_like(got, x, call)
    _expect_nan_where_all_minus_infinity(got, torch.softmax(x, dim=dim), call)


@exercise("softmax")
def test_softmax_gradient(submission, inputs):
    """has the gradient of torch.softmax (autograd, float64)"""
    x = inputs.randn(3, 5, dtype=torch.float64)
    upstream = inputs.randn(3, 5, dtype=torch.float64)
    (got, grads), call = run_with_gradients(submission, "softmax", [x], {"dim": -1}, [0], None, upstream)
    expect_close(got, torch.softmax(x, dim=-1), call)
    expect_close(grads[0], oracles.softmax_gradient(x, upstream), f"gradient of {call} with respect to x",
                 reference="torch.softmax's gradient")


# -- scaled_dot_product_attention --------------------------------------------------


def _qkv(inputs, q_shape, k_shape, v_shape, dtype=torch.float32):
    return (inputs.randn(*q_shape, dtype=dtype), inputs.randn(*k_shape, dtype=dtype),
            inputs.randn(*v_shape, dtype=dtype))


@exercise("scaled_dot_product_attention")
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=case_ids(ATTENTION_CASES))
def test_attention_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    q, k, v = _qkv(inputs, *case[1:])
    got, call = run(submission, "scaled_dot_product_attention", q, k, v)
    expect_attention(got, reference.scaled_dot_product_attention(q, k, v), call,
                      bugs.scaled_dot_product_attention(q, k, v))


@exercise("scaled_dot_product_attention")
@pytest.mark.parametrize("kind", ["bool-per-batch", "bool-broadcast", "causal", "float-additive"])
def test_attention_with_mask_matches_reference(submission, reference, bugs, inputs, kind):
    """with a mask, matches the reference"""
    q, k, v = _qkv(inputs, (2, 6, 8), (2, 6, 8), (2, 6, 4))
    if kind == "bool-per-batch":
        mask = inputs.mask(2, 6, 6)
    elif kind == "bool-broadcast":
        mask = inputs.mask(6, 6)
    elif kind == "causal":
        mask = torch.ones(6, 6, dtype=torch.bool).tril()
    else:
        mask = inputs.randn(2, 6, 6).masked_fill(~inputs.mask(2, 6, 6), float("-inf"))
    got, call = run(submission, "scaled_dot_product_attention", q, k, v, mask=mask)
    expect_attention(got, reference.scaled_dot_product_attention(q, k, v, mask=mask),
                      f"{call} ({kind} mask)", bugs.scaled_dot_product_attention(q, k, v, mask=mask))


@exercise("scaled_dot_product_attention")
@pytest.mark.parametrize("case", ATTENTION_CASES[1:3], ids=case_ids(ATTENTION_CASES[1:3]))
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_attention_matches_pytorch(submission, inputs, case, masked):
    """matches F.scaled_dot_product_attention"""
    q, k, v = _qkv(inputs, *case[1:])
    mask = inputs.mask(q.shape[-2], k.shape[-2]) if masked else None
    got, call = run(submission, "scaled_dot_product_attention", q, k, v, mask=mask)
    expect_attention(got, oracles.attention(q, k, v, mask), call, reference="PyTorch")


@exercise("scaled_dot_product_attention")
def test_attention_uses_given_scale(submission, reference, inputs):
    """multiplies the scores by the scale it is given"""
    q, k, v = _qkv(inputs, (2, 5, 8), (2, 7, 8), (2, 7, 4))
    for scale in (0.37, 2.0):
        got, call = run(submission, "scaled_dot_product_attention", q, k, v, scale=scale)
        expect_attention(got, oracles.attention(q, k, v, scale=scale), call, reference="PyTorch")


@exercise("scaled_dot_product_attention")
def test_attention_weights_are_probabilities(submission, inputs):
    """each query's weights are >= 0, sum to 1, and are 0 on masked keys"""
    q, k, v = _qkv(inputs, (3, 6, 8), (3, 9, 8), (3, 9, 8))
    mask = inputs.mask(3, 6, 9, keep=0.5)
    got, call = run(submission, "scaled_dot_product_attention", q, k, v, mask=mask)
    _, weights = unpack(got, ("output", "weights"), call)
    expect_like(weights, torch.empty(3, 6, 9), f"weights of {call}")
    expect_finite(weights, f"weights of {call}", NO_KEY)
    sums = weights.sum(dim=-1)
    expect_true(bool((weights >= 0).all()), f"weights of {call} have negative entries")
    expect_true(torch.allclose(sums, torch.ones_like(sums), atol=1e-5),
                f"weights of {call} do not sum to 1 over the keys (dim=-1)")
    expect_true(bool((weights[~mask] == 0).all()),
                f"weights of {call} are not exactly 0 where the mask is False")


@exercise("scaled_dot_product_attention")
def test_attention_fully_masked_query_gives_zeros(submission, bugs, inputs):
    """a query whose keys are all masked gets zero weights and a zero output"""
    q, k, v = _qkv(inputs, (2, 5, 8), (2, 7, 8), (2, 7, 4))
    mask = inputs.mask(2, 5, 7)
    mask[0, 1] = False
    mask[1, 4] = False
    got, call = run(submission, "scaled_dot_product_attention", q, k, v, mask=mask)
    expect_attention(got, oracles.attention(q, k, v, mask),
                      f"{call} where queries [0, 1] and [1, 4] may attend to no key",
                      bugs.scaled_dot_product_attention(q, k, v, mask=mask), reference="PyTorch")


@exercise("scaled_dot_product_attention")
def test_attention_survives_huge_scores(submission, bugs, inputs):
    """stays finite when scores reach ±1e4"""
    # float64, where exp overflows past 709 too. Scores of 1e4 rounded to
    # float32 (which the precision rule allows inside) move by 1e-3, and the
    # weights with them: rtol 1e-2 leaves room for that, and none for nan.
    q, k, v = _qkv(inputs, (2, 4, 8), (2, 6, 8), (2, 6, 3), dtype=torch.float64)
    q, k = q * 40, k * 40
    got, call = run(submission, "scaled_dot_product_attention", q, k, v)
    expect_attention(got, oracles.attention(q, k, v), f"{call} with scores up to ±1e4",
                     bugs.scaled_dot_product_attention(q, k, v), reference="PyTorch", rtol=1e-2)


@exercise("scaled_dot_product_attention")
def test_attention_gradients(submission, inputs):
    """has the gradients of PyTorch's attention (autograd, float64)"""
    q, k, v = _qkv(inputs, (2, 5, 4), (2, 6, 4), (2, 6, 3), dtype=torch.float64)
    mask = inputs.mask(5, 6)
    upstream = inputs.randn(2, 5, 3, dtype=torch.float64)
    (got, grads), call = run_with_gradients(submission, "scaled_dot_product_attention",
                                         [q, k, v], {"mask": mask}, [0, 1, 2], 0, upstream)
    expect_attention(got, oracles.attention(q, k, v, mask), call, reference="PyTorch")
    expect_gradients(grads, oracles.attention_gradients(q, k, v, mask, upstream), "qkv", call)


# -- self_attention -------------------------------------------------------------------

# (id, x shape, d_k, d_v): square and non-square projections, batch dims.
SELF_ATTENTION_CASES = [
    ("T5-d8-square", (5, 8), 8, 8),
    ("B2-T6-d8-dk4-dv6", (2, 6, 8), 4, 6),
    ("B2x3-T4-d6-dk6-dv2", (2, 3, 4, 6), 6, 2),
    ("B1-T7-d3-dk1-dv1", (1, 7, 3), 1, 1),
]


def _projections(inputs, d_model, d_k, d_v, dtype=torch.float32):
    return (inputs.randn(d_k, d_model, dtype=dtype), inputs.randn(d_k, d_model, dtype=dtype),
            inputs.randn(d_v, d_model, dtype=dtype))


@exercise("self_attention")
@pytest.mark.parametrize("case", SELF_ATTENTION_CASES, ids=case_ids(SELF_ATTENTION_CASES))
def test_self_attention_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    _, x_shape, d_k, d_v = case
    x = inputs.randn(*x_shape)
    weights = _projections(inputs, x_shape[-1], d_k, d_v)
    got, call = run(submission, "self_attention", x, *weights)
    expect_attention(got, reference.self_attention(x, *weights), call,
                      bugs.self_attention(x, *weights))


@exercise("self_attention")
@pytest.mark.parametrize("case", SELF_ATTENTION_CASES[:2], ids=case_ids(SELF_ATTENTION_CASES[:2]))
def test_self_attention_matches_pytorch(submission, inputs, case):
    """matches F.linear + F.scaled_dot_product_attention"""
    _, x_shape, d_k, d_v = case
    x = inputs.randn(*x_shape)
    weights = _projections(inputs, x_shape[-1], d_k, d_v)
    got, call = run(submission, "self_attention", x, *weights)
    expect_attention(got, oracles.self_attention(x, *weights), call, reference="PyTorch")


@exercise("self_attention")
def test_self_attention_with_causal_mask(submission, bugs, inputs):
    """with a causal mask, matches PyTorch"""
    x = inputs.randn(2, 6, 8)
    weights = _projections(inputs, 8, 4, 4)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    got, call = run(submission, "self_attention", x, *weights, mask=mask)
    expect_attention(got, oracles.self_attention(x, *weights, mask), f"{call} (causal mask)",
                      bugs.self_attention(x, *weights, mask=mask), reference="PyTorch")


@exercise("self_attention")
def test_self_attention_is_permutation_equivariant(submission, inputs):
    """shuffling the tokens shuffles the output the same way"""
    x = inputs.randn(2, 7, 8)
    weights = _projections(inputs, 8, 4, 5)
    order = inputs.permutation(7)
    plain, call = run(submission, "self_attention", x, *weights)
    shuffled, _ = run(submission, "self_attention", x[:, order], *weights)
    output, attention = unpack(plain, ("output", "weights"), call)
    output_shuffled, attention_shuffled = unpack(shuffled, ("output", "weights"), call)
    expect_finite(output, f"output of {call}", nan_only=True)
    expect_finite(attention, f"weights of {call}", nan_only=True)
    expect_close(output_shuffled, output[:, order],
                 f"output of {call} for shuffled tokens", reference="your unshuffled output, shuffled")
    expect_close(attention_shuffled, attention[:, order][:, :, order],
                 f"weights of {call} for shuffled tokens", reference="your unshuffled weights, shuffled")


@exercise("self_attention")
def test_self_attention_gradients(submission, inputs):
    """has the gradients of PyTorch's attention (autograd, float64)"""
    x = inputs.randn(2, 5, 6, dtype=torch.float64)
    # Scaled so that scores stay near 1: with peaked weights some gradients
    # cancel down to 1e-3, where float32 arithmetic inside is off by more than atol.
    weights = [w / 6**0.5 for w in _projections(inputs, 6, 4, 3, dtype=torch.float64)]
    upstream = inputs.randn(2, 5, 3, dtype=torch.float64)
    (got, grads), call = run_with_gradients(submission, "self_attention", [x, *weights], {},
                                         [0, 1, 2, 3], 0, upstream)
    expect_attention(got, oracles.self_attention(x, *weights), call, reference="PyTorch")
    expect_gradients(grads, oracles.self_attention_gradients(x, *weights, upstream),
                     ("x", "w_q", "w_k", "w_v"), call)


# -- NumPy ------------------------------------------------------------------------------


@exercise("softmax_numpy")
@pytest.mark.parametrize("shape, axis", SOFTMAX_CASES[:4], ids=_softmax_ids(SOFTMAX_CASES[:4]))
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_softmax_numpy_matches_reference(submission, reference, bugs, inputs, shape, axis, dtype):
    """matches the reference"""
    x = inputs.numpy(*shape, dtype=dtype) * 3
    got, call = run(submission, "softmax_numpy", x, axis=axis)
    expect_close(got, reference.softmax_numpy(x, axis=axis), call, lookalikes=bugs.softmax_numpy(x, axis=axis))


@exercise("softmax_numpy")
def test_softmax_numpy_matches_pytorch(submission, inputs):
    """matches torch.softmax"""
    x = inputs.numpy(4, 7) * 3
    got, call = run(submission, "softmax_numpy", x, axis=-1)
    expect_close(got, torch.softmax(torch.from_numpy(x), dim=-1).numpy(), call, reference="torch.softmax")


@exercise("softmax_numpy")
def test_softmax_numpy_survives_huge_logits(submission, bugs, inputs):
    """stays finite for logits of ±1e4"""
    x = inputs.numpy(3, 6) * 1e4
    got, call = run(submission, "softmax_numpy", x, axis=-1)
    expect_close(got, torch.softmax(torch.from_numpy(x), dim=-1).numpy(),
                 f"{call} with entries up to ±1e4", lookalikes=bugs.softmax_numpy(x, axis=-1),
                 reference="torch.softmax")


@exercise("softmax_numpy")
def test_softmax_numpy_of_a_row_of_minus_infinity_is_nan(submission, inputs):
    """gives NaN along a row that is all -inf"""
    x = inputs.numpy(3, 5)
    x[1] = -np.inf
    got, call = run(submission, "softmax_numpy", x, axis=-1)
    expect_like(got, x, call)
    _expect_nan_where_all_minus_infinity(got, torch.softmax(torch.from_numpy(x), dim=-1).numpy(), call)


@exercise("scaled_dot_product_attention_numpy")
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=case_ids(ATTENTION_CASES))
def test_attention_numpy_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    q, k, v = (inputs.numpy(*shape) for shape in case[1:])
    got, call = run(submission, "scaled_dot_product_attention_numpy", q, k, v)
    expect_attention(got, reference.scaled_dot_product_attention_numpy(q, k, v), call,
                      bugs.scaled_dot_product_attention_numpy(q, k, v))


@exercise("scaled_dot_product_attention_numpy")
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_attention_numpy_with_mask_matches_pytorch(submission, bugs, inputs, dtype):
    """with a mask, matches F.scaled_dot_product_attention"""
    q, k, v = (inputs.numpy(*shape, dtype=dtype) for shape in ((2, 5, 8), (2, 7, 8), (2, 7, 3)))
    mask = inputs.mask(2, 5, 7).cpu().numpy()
    mask[1, 2] = False  # one query with no key at all: zeros
    got, call = run(submission, "scaled_dot_product_attention_numpy", q, k, v, mask=mask)
    output, weights = oracles.attention(*(torch.from_numpy(a) for a in (q, k, v)), torch.from_numpy(mask))
    expect_attention(got, (output.numpy(), weights.numpy()), f"{call} (query [1, 2] fully masked)",
                      bugs.scaled_dot_product_attention_numpy(q, k, v, mask=mask), reference="PyTorch")


# -- every exercise -----------------------------------------------------------------------

# A tensor made without device= stays on the CPU on a GPU machine; the
# worker's device tracking shows where, on any machine.
test_would_run_on_a_gpu = portability_check([
    portable("softmax", lambda inputs: ((inputs.randn(2, 3, 5),), {})),
    portable("scaled_dot_product_attention", lambda inputs: (
        _qkv(inputs, (2, 4, 8), (2, 6, 8), (2, 6, 3)), {"mask": inputs.mask(4, 6)})),
    portable("self_attention", lambda inputs: (
        (inputs.randn(2, 5, 8), *_projections(inputs, 8, 4, 6)), {"mask": inputs.mask(5, 5)})),
])
