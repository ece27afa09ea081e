"""Hidden checks for chapter 5: rotary position embeddings (RoPE).

Every exercise is checked against the reference on several shapes and kinds
of positions, against an independent oracle (Meta's complex multiplication,
Hugging Face's rotate_half formula, PyTorch's own attention), against
properties that hold in any RoPE convention (norms kept, position 0 is the
identity, scores depend only on m - n) and, on a mismatch, against known
wrong implementations, whose hint then goes with the failure.

Angles are float32 by the chapter's rules, and a correct student may compute
the frequencies another way (float64, ``1 / theta ** (arange(0, d, 2) / d)``),
which moves an angle by about position * 6e-8 radians. So float32 checks
keep positions below 100, where that is far inside the default tolerance,
and the checks at large positions (float16) say why their tolerance is looser.
"""

import math

import pytest
import torch

from grader.checks import (
    case_ids,
    exercise,
    expect_finite,
    expect_gradients,
    NO_KEY,
    Oracles,
    portability_check,
    portable,
    run,
    run_with_gradients,
)
from grader.compare import expect_close, expect_like, expect_true, matching_hint

# Other people's RoPE code, not the course's (oracles.py).
oracles = Oracles("ch05")

# -- inputs ----------------------------------------------------------------------------

POSITION_KINDS = ("arange", "offset", "gaps", "shuffled")


def _positions(inputs, kind: str, shape: tuple[int, ...]) -> torch.Tensor:
    """int64 positions of ``shape`` (the last dimension is the tokens), all below 100.

    arange: 0 .. T-1; offset: a chunk that starts at 41; gaps: increasing
    with steps of 1 to 8; shuffled: distinct positions below 64 in any order.
    """
    length = shape[-1]
    if kind == "arange":
        return torch.arange(length).expand(shape).clone()
    if kind == "offset":
        return (torch.arange(length) + 41).expand(shape).clone()
    if kind == "gaps":
        return torch.randint(1, 9, shape, generator=inputs.generator).cumsum(-1)
    if kind == "shuffled":
        rows = math.prod(shape[:-1])
        return torch.stack([inputs.permutation(64)[:length] for _ in range(rows)]).reshape(shape)
    raise ValueError(kind)


def _d_ids(head_dim: int) -> str:
    return f"d{head_dim}"


# -- rope_angles -----------------------------------------------------------------------

# (id, positions shape, head_dim, theta, largest position)
ANGLE_CASES = [
    ("T6-d8", (6,), 8, 10000.0, 64),
    ("T5-d2", (5,), 2, 10000.0, 64),
    ("B2-T7-d64", (2, 7), 64, 10000.0, 4096),
    ("B2x3-T4-d16-theta5e5", (2, 3, 4), 16, 500000.0, 100000),
    ("T1-d6", (1,), 6, 10000.0, 64),
]


@exercise("rope_angles")
@pytest.mark.parametrize("case", ANGLE_CASES, ids=case_ids(ANGLE_CASES))
def test_rope_angles_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    _, shape, head_dim, theta, largest = case
    positions = torch.randint(0, largest, shape, generator=inputs.generator)
    got, call = run(submission, "rope_angles", positions, head_dim, theta)
    expect_close(got, reference.rope_angles(positions, head_dim, theta), call,
                 lookalikes=bugs.rope_angles(positions, head_dim, theta))


@exercise("rope_angles")
@pytest.mark.parametrize("case", ANGLE_CASES[:4], ids=case_ids(ANGLE_CASES[:4]))
def test_rope_angles_matches_the_formula(submission, bugs, inputs, case):
    """matches position * theta^(-2k/d), k = 0 .. d/2 - 1, computed with Python's math"""
    # Relative errors of float32 angles stay near 1e-7 at any position, so
    # even position 100000 is within the default tolerance (rtol 1e-4).
    _, shape, head_dim, theta, largest = case
    positions = torch.randint(0, largest, shape, generator=inputs.generator)
    got, call = run(submission, "rope_angles", positions, head_dim, theta)
    expect_close(got, oracles.angles_by_hand(positions, head_dim, theta), call,
                 lookalikes=bugs.rope_angles(positions, head_dim, theta),
                 reference="position * theta ** (-2k / d)")


@exercise("rope_angles")
def test_rope_angles_first_and_last_frequency(submission, bugs):
    """at position 1, pair 0 turns by 1 radian and pair d/2 - 1 by theta^(-(d-2)/d)"""
    positions = torch.tensor([1])
    got, call = run(submission, "rope_angles", positions, 8, 10000.0)
    expected = torch.tensor([[1.0, 0.1, 0.01, 0.001]])  # 10000^(-0/8), ^(-2/8), ^(-4/8), ^(-6/8)
    expect_close(got, expected, f"{call} at position 1", lookalikes=bugs.rope_angles(positions, 8, 10000.0),
                 reference="(1, 0.1, 0.01, 0.001)")


# -- apply_rope and apply_rope_half: shared cases -------------------------------------------

# (id, x shape, positions shape, kind of positions, theta)
ROPE_CASES = [
    ("T6-d8-arange", (6, 8), (6,), "arange", 10000.0),
    ("T7-d8-offset", (7, 8), (7,), "offset", 10000.0),
    ("B2-T5-d16-gaps", (2, 5, 16), (2, 5), "gaps", 10000.0),
    ("B2-H3-T4-d4-shuffled", (2, 3, 4, 4), (2, 1, 4), "shuffled", 10000.0),
    ("T5-d2-shuffled", (5, 2), (5,), "shuffled", 10000.0),
    ("B3-T1-d6-offset", (3, 1, 6), (3, 1), "offset", 10000.0),
    ("B2-T6-d12-shuffled-theta5e5", (2, 6, 12), (2, 6), "shuffled", 500000.0),
]
ORACLE_CASES = [ROPE_CASES[i] for i in (1, 2, 3, 6)]


def _rope_inputs(inputs, case, dtype=torch.float32):
    _, x_shape, positions_shape, kind, theta = case
    return inputs.randn(*x_shape, dtype=dtype), _positions(inputs, kind, positions_shape), theta


def _expect_relative_scores(submission, function: str, inputs) -> None:
    """Rotate q at m and k at n, then at m + c and n + c: every score q . k must stay the same."""
    q, k = inputs.randn(6, 8), inputs.randn(6, 8)  # six (query, key) pairs, one a row
    m = torch.tensor([5, 8, 13, 0, 20, 3])
    n = torch.tensor([2, 5, 10, 7, 20, 30])
    shift = 37
    rotated = {}
    for label, (at_m, at_n) in {"before": (m, n), "after": (m + shift, n + shift)}.items():
        q_m, call_q = run(submission, function, q, at_m)
        k_n, call_k = run(submission, function, k, at_n)
        expect_like(q_m, q, call_q)
        expect_like(k_n, k, call_k)
        rotated[label] = (q_m * k_n).sum(dim=-1)  # (6,): q_m . k_n
    # Both score sets come from the same code; atol 1e-3 leaves room for the
    # float32 rounding of angles near position 60 (|q| |k| is about 8).
    expect_close(rotated["after"], rotated["before"],
                 f"the scores {function}(q, m) . {function}(k, n) with m and n both shifted by {shift}",
                 atol=1e-3, reference="the same scores before the shift (RoPE scores depend on m - n only)")


def _expect_norms_kept(submission, function: str, inputs) -> None:
    x = inputs.randn(2, 6, 8) * 3
    positions = _positions(inputs, "shuffled", (2, 6))
    got, call = run(submission, function, x, positions)
    expect_like(got, x, call)
    expect_close(got.norm(dim=-1), x.norm(dim=-1), f"the norm of each vector of {call}",
                 reference="the norms of x (a rotation keeps lengths)")


def _expect_identity_at_zero(submission, function: str, inputs) -> None:
    x = inputs.randn(2, 5, 8)
    positions = torch.zeros(2, 5, dtype=torch.int64)
    got, call = run(submission, function, x, positions)
    expect_close(got, x, f"{call} with every position 0", reference="x itself (angle 0 turns nothing)")


def _expect_float16_at_large_positions(submission, bugs, inputs, function: str, oracle: str) -> None:
    x = inputs.randn(2, 5, 16, dtype=torch.float16)
    positions = torch.randint(1000, 2001, (2, 5), generator=inputs.generator)
    got, call = run(submission, function, x, positions)
    # The answer must be float16, within float16 rounding of the float32
    # computation. A correct answer that multiplies in float16 is off by about
    # 5e-4; angles rounded to float16 (ulp 0.5 to 1 radian here) by 0.1 or more.
    expect_close(got, getattr(oracles, oracle)(x.float(), positions).half(), f"{call} at positions 1000 to 2000",
                 lookalikes=getattr(bugs, function)(x, positions), rtol=1e-2, atol=5e-3,
                 reference="the same rotation computed in float32")


def _expect_float64_kept(submission, reference, inputs, function: str) -> None:
    x = inputs.randn(2, 5, 8, dtype=torch.float64)
    positions = _positions(inputs, "gaps", (2, 5))
    got, call = run(submission, function, x, positions)
    # Angles are float32 by the chapter's rules, so float64 answers agree to
    # float32 precision only: compare with float32 tolerances.
    expect_close(got, getattr(reference, function)(x, positions), call, rtol=1e-4, atol=1e-5)


# -- apply_rope ---------------------------------------------------------------------------------


@exercise("apply_rope")
@pytest.mark.parametrize("case", ROPE_CASES, ids=case_ids(ROPE_CASES))
def test_apply_rope_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    x, positions, theta = _rope_inputs(inputs, case)
    got, call = run(submission, "apply_rope", x, positions, theta)
    expect_close(got, reference.apply_rope(x, positions, theta), f"{call} ({case[3]} positions)",
                 lookalikes=bugs.apply_rope(x, positions, theta))


@exercise("apply_rope")
@pytest.mark.parametrize("case", ORACLE_CASES, ids=case_ids(ORACLE_CASES))
def test_apply_rope_matches_complex_multiplication(submission, bugs, inputs, case):
    """matches complex multiplication (Meta's LLaMA: view_as_complex times polar(1, angle))"""
    x, positions, theta = _rope_inputs(inputs, case)
    got, call = run(submission, "apply_rope", x, positions, theta)
    expect_close(got, oracles.complex_rope(x, positions, theta), f"{call} ({case[3]} positions)",
                 lookalikes=bugs.apply_rope(x, positions, theta), reference="complex multiplication")


@exercise("apply_rope")
def test_apply_rope_keeps_norms(submission, inputs):
    """keeps the length of every vector"""
    _expect_norms_kept(submission, "apply_rope", inputs)


@exercise("apply_rope")
def test_apply_rope_position_zero_is_identity(submission, inputs):
    """leaves vectors at position 0 unchanged"""
    _expect_identity_at_zero(submission, "apply_rope", inputs)


@exercise("apply_rope")
def test_apply_rope_scores_depend_on_relative_position(submission, inputs):
    """q_m . k_n depends only on m - n"""
    _expect_relative_scores(submission, "apply_rope", inputs)


@exercise("apply_rope")
def test_apply_rope_float16_at_large_positions(submission, bugs, inputs):
    """float16 vectors at positions 1000 to 2000: angles computed in float32, answer in float16"""
    _expect_float16_at_large_positions(submission, bugs, inputs, "apply_rope", "complex_rope")


@exercise("apply_rope")
def test_apply_rope_keeps_float64(submission, reference, inputs):
    """keeps float64 inputs in float64"""
    _expect_float64_kept(submission, reference, inputs, "apply_rope")


@exercise("apply_rope")
def test_apply_rope_gradient(submission, inputs):
    """has the gradient of complex multiplication (autograd)"""
    # RoPE is linear in x, so float32 gradients are as exact as its values.
    x = inputs.randn(2, 5, 8)
    positions = _positions(inputs, "shuffled", (2, 5))
    upstream = inputs.randn(2, 5, 8)
    (got, grads), call = run_with_gradients(submission, "apply_rope", [x, positions], {}, [0], None, upstream)
    expect_close(got, oracles.complex_rope(x, positions), call, reference="complex multiplication")
    expected = oracles.complex_rope_gradient(x, positions, upstream)
    expect_gradients(grads, [expected], ["x"], call, reference="complex multiplication")


# -- apply_rope_half ----------------------------------------------------------------------------


@exercise("apply_rope_half")
@pytest.mark.parametrize("case", ROPE_CASES, ids=case_ids(ROPE_CASES))
def test_apply_rope_half_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    x, positions, theta = _rope_inputs(inputs, case)
    got, call = run(submission, "apply_rope_half", x, positions, theta)
    expect_close(got, reference.apply_rope_half(x, positions, theta), f"{call} ({case[3]} positions)",
                 lookalikes=bugs.apply_rope_half(x, positions, theta))


@exercise("apply_rope_half")
@pytest.mark.parametrize("case", ORACLE_CASES, ids=case_ids(ORACLE_CASES))
def test_apply_rope_half_matches_hugging_face(submission, bugs, inputs, case):
    """matches Hugging Face's formula: x * cos + rotate_half(x) * sin"""
    x, positions, theta = _rope_inputs(inputs, case)
    got, call = run(submission, "apply_rope_half", x, positions, theta)
    expect_close(got, oracles.hf_rope(x, positions, theta), f"{call} ({case[3]} positions)",
                 lookalikes=bugs.apply_rope_half(x, positions, theta), reference="Hugging Face's rotate_half")


@exercise("apply_rope_half")
@pytest.mark.parametrize("head_dim", [2, 8, 12], ids=_d_ids)
def test_apply_rope_half_is_apply_rope_permuted(submission, reference, bugs, inputs, head_dim):
    """apply_rope_half(x[..., perm]) equals apply_rope(x)[..., perm]"""
    x = inputs.randn(2, 5, head_dim)
    positions = _positions(inputs, "shuffled", (2, 5))
    perm = reference.adjacent_to_half_permutation(head_dim)
    got, call = run(submission, "apply_rope_half", x[..., perm], positions)
    expect_close(got, reference.apply_rope(x, positions)[..., perm], f"{call} with x[..., perm]",
                 lookalikes=bugs.apply_rope_half(x[..., perm], positions),
                 reference="apply_rope(x)[..., perm], perm = [0, 2, 4, ..., 1, 3, 5, ...]")


@exercise("apply_rope_half")
def test_apply_rope_half_keeps_norms(submission, inputs):
    """keeps the length of every vector"""
    _expect_norms_kept(submission, "apply_rope_half", inputs)


@exercise("apply_rope_half")
def test_apply_rope_half_position_zero_is_identity(submission, inputs):
    """leaves vectors at position 0 unchanged"""
    _expect_identity_at_zero(submission, "apply_rope_half", inputs)


@exercise("apply_rope_half")
def test_apply_rope_half_scores_depend_on_relative_position(submission, inputs):
    """q_m . k_n depends only on m - n"""
    _expect_relative_scores(submission, "apply_rope_half", inputs)


@exercise("apply_rope_half")
def test_apply_rope_half_float16_at_large_positions(submission, bugs, inputs):
    """float16 vectors at positions 1000 to 2000: angles computed in float32, answer in float16"""
    _expect_float16_at_large_positions(submission, bugs, inputs, "apply_rope_half", "hf_rope")


@exercise("apply_rope_half")
def test_apply_rope_half_keeps_float64(submission, reference, inputs):
    """keeps float64 inputs in float64"""
    _expect_float64_kept(submission, reference, inputs, "apply_rope_half")


# -- adjacent_to_half_permutation ----------------------------------------------------------------


@exercise("adjacent_to_half_permutation")
@pytest.mark.parametrize("head_dim", [2, 8, 64], ids=_d_ids)
def test_permutation_matches_reference(submission, reference, bugs, head_dim):
    """matches the reference"""
    got, call = run(submission, "adjacent_to_half_permutation", head_dim, device=submission.device)
    expect_close(got, reference.adjacent_to_half_permutation(head_dim), call,
                 lookalikes=bugs.adjacent_to_half_permutation(head_dim))


@exercise("adjacent_to_half_permutation")
@pytest.mark.parametrize("head_dim", [6, 16], ids=_d_ids)
def test_permutation_is_a_permutation(submission, head_dim):
    """holds every index 0 .. d-1 exactly once"""
    got, call = run(submission, "adjacent_to_half_permutation", head_dim, device=submission.device)
    expect_like(got, torch.arange(head_dim), call)
    expect_true(torch.equal(got.sort().values, torch.arange(head_dim)),
                f"{call} is {got.tolist()}: not a permutation of 0 .. {head_dim - 1}")


@exercise("adjacent_to_half_permutation")
@pytest.mark.parametrize("head_dim", [8, 12], ids=_d_ids)
def test_permutation_turns_one_convention_into_the_other(submission, inputs, head_dim):
    """apply_rope_half(x[..., perm]) equals apply_rope(x)[..., perm] (with trusted RoPE code)"""
    got, call = run(submission, "adjacent_to_half_permutation", head_dim, device=submission.device)
    expect_like(got, torch.arange(head_dim), call)
    expect_true(torch.equal(got.sort().values, torch.arange(head_dim)),
                f"{call} is {got.tolist()}: not a permutation of 0 .. {head_dim - 1}")
    x = inputs.randn(2, 5, head_dim)
    positions = _positions(inputs, "shuffled", (2, 5))
    # RoPE is linear in x: the oracles give each token's rotation as a (d, d)
    # matrix M, rope(x) = x @ M, from the check's own positions, and only the
    # student's permutation reorders here. An oracle asked about x[..., perm]
    # itself could not answer in the student edition, which holds the answers
    # to the calls the reference's grade made.
    half = oracles.hf_rope_matrices(positions, head_dim)  # (B, T, d, d)
    adjacent = oracles.complex_rope_matrices(positions, head_dim)  # (B, T, d, d)
    permuted = x[..., got].unsqueeze(-2) @ half  # (B, T, 1, d)
    expect_close(permuted.squeeze(-2), (x.unsqueeze(-2) @ adjacent).squeeze(-2)[..., got],
                 f"apply_rope_half(x[..., perm]) with perm = {call}", reference="apply_rope(x)[..., perm]")


# -- rope_self_attention ---------------------------------------------------------------------------

MAX_SEQ_LEN = 128
# (id, x shape, heads, positions shape or None, kind of positions, theta)
ATTENTION_CASES = [
    ("T5-D8-H2-default", (5, 8), 2, None, "", 10000.0),
    ("B2-T6-D16-H4-offset", (2, 6, 16), 4, (6,), "offset", 10000.0),
    ("B2-T6-D8-H2-shuffled", (2, 6, 8), 2, (2, 6), "shuffled", 10000.0),
    ("B3-T5-D12-H6-d2-gaps", (3, 5, 12), 6, (3, 5), "gaps", 10000.0),
    ("B2x2-T4-D8-H1-shuffled", (2, 2, 4, 8), 1, (2, 2, 4), "shuffled", 10000.0),
    ("B1-T1-D8-H2-offset", (1, 1, 8), 2, (1, 1), "offset", 10000.0),
    ("B2-T7-D16-H2-gaps-theta5e5", (2, 7, 16), 2, (2, 7), "gaps", 500000.0),
]


def _below_max_seq_len(positions: torch.Tensor) -> torch.Tensor:
    """``positions``, which the docstring promises stay below max_seq_len:
    what code does past it (raise, or rotate anyway) is its own affair."""
    assert int(positions.max()) < MAX_SEQ_LEN, "a check would break rope_self_attention's contract"
    return positions


def _attention_inputs(inputs, case, dtype=torch.float32):
    _, x_shape, num_heads, positions_shape, kind, theta = case
    d_model = x_shape[-1]
    x = inputs.randn(*x_shape, dtype=dtype)
    # Scaled so that queries and keys have entries of size 1 and softmax is not one-hot.
    weights = [inputs.randn(d_model, d_model, dtype=dtype) / math.sqrt(d_model) for _ in range(4)]
    positions = None if positions_shape is None else _below_max_seq_len(_positions(inputs, kind, positions_shape))
    return [d_model, num_heads, MAX_SEQ_LEN, theta, *weights, x], positions


@exercise("rope_self_attention")
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=case_ids(ATTENTION_CASES))
def test_rope_attention_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    args, positions = _attention_inputs(inputs, case)
    got, call = run(submission, "rope_self_attention", *args, token_positions=positions)
    expect_close(got, reference.rope_self_attention(*args, token_positions=positions),
                 f"{call} ({case[4] or 'default'} positions)",
                 lookalikes=bugs.rope_self_attention(*args, token_positions=positions))


@exercise("rope_self_attention")
@pytest.mark.parametrize("case", ATTENTION_CASES[:4], ids=case_ids(ATTENTION_CASES[:4]))
def test_rope_attention_matches_pytorch(submission, bugs, inputs, case):
    """matches complex RoPE on q and k + F.scaled_dot_product_attention(is_causal=True)"""
    args, positions = _attention_inputs(inputs, case)
    d_model, num_heads, _, theta, w_q, w_k, w_v, w_o, x = args
    got, call = run(submission, "rope_self_attention", *args, token_positions=positions)
    expect_close(got, oracles.rope_attention(x, w_q, w_k, w_v, w_o, num_heads, positions, theta),
                 f"{call} ({case[4] or 'default'} positions)",
                 lookalikes=bugs.rope_self_attention(*args, token_positions=positions), reference="PyTorch")


@exercise("rope_self_attention")
def test_rope_attention_default_positions_are_arange(submission, inputs):
    """without token_positions, uses positions 0 .. T-1"""
    args, _ = _attention_inputs(inputs, ATTENTION_CASES[2])
    plain, call = run(submission, "rope_self_attention", *args)
    explicit, _ = run(submission, "rope_self_attention", *args, token_positions=torch.arange(6))
    expect_like(explicit, args[-1], call)
    expect_finite(explicit, f"{call} with token_positions=arange(T)", NO_KEY, nan_only=True)
    expect_close(plain, explicit, f"{call} without token_positions",
                 reference="your output with token_positions=arange(T)")


@exercise("rope_self_attention")
def test_rope_attention_depends_on_relative_positions(submission, bugs, inputs):
    """shifting every position by the same amount leaves the output unchanged"""
    args, positions = _attention_inputs(inputs, ATTENTION_CASES[2])
    plain, call = run(submission, "rope_self_attention", *args, token_positions=positions)
    shifted, _ = run(submission, "rope_self_attention", *args, token_positions=_below_max_seq_len(positions + 29))
    expect_like(plain, args[-1], call)
    lookalikes = bugs.rope_self_attention(*args, token_positions=positions + 29)
    expect_finite(plain, call, NO_KEY, hint=matching_hint(shifted, lookalikes), nan_only=True)
    # Two runs of the same code at positions below 100: atol 1e-4 covers the
    # float32 rounding of angles that grow by 29.
    expect_close(shifted, plain, f"{call} with every position shifted by 29", lookalikes=lookalikes, atol=1e-4,
                 reference="your output before the shift (only q and k turn, so only m - n counts)")


@exercise("rope_self_attention")
def test_rope_attention_is_causal(submission, inputs):
    """changing later tokens changes no earlier output"""
    args, positions = _attention_inputs(inputs, ATTENTION_CASES[3])
    x = args[-1]
    changed = x.clone()
    changed[:, 3:] = inputs.randn(3, 2, 12)
    before, call = run(submission, "rope_self_attention", *args, token_positions=positions)
    after, _ = run(submission, "rope_self_attention", *args[:-1], changed, token_positions=positions)
    expect_like(before, x, call)
    expect_like(after, x, call)
    expect_close(after[:, :3], before[:, :3],
                 f"outputs of tokens 0 to 2 of {call} after tokens 3 and 4 change",
                 reference="the outputs before the change (token t may see tokens 0 .. t only)")


@exercise("rope_self_attention")
def test_rope_attention_gradients(submission, inputs):
    """has the gradients of PyTorch's attention with complex RoPE (autograd)"""
    # float32: the angles are float32 by the chapter's rules, so float64
    # inputs would not make the comparison any tighter.
    case = ("B2-T5-D8-H2-gaps", (2, 5, 8), 2, (2, 5), "gaps", 10000.0)
    args, positions = _attention_inputs(inputs, case)
    d_model, num_heads, max_seq_len, theta, *tensors = args
    upstream = inputs.randn(2, 5, 8)
    (got, grads), call = run_with_gradients(submission, "rope_self_attention", args,
                                            {"token_positions": positions}, [4, 5, 6, 7, 8], None, upstream)
    expect_close(got, oracles.rope_attention(tensors[4], *tensors[:4], num_heads, positions, theta), call,
                 reference="PyTorch")
    expected = oracles.rope_attention_gradients(tensors[4], *tensors[:4], num_heads, positions, theta, upstream)
    expect_gradients(grads, expected, ("w_q", "w_k", "w_v", "w_o", "x"), call)


# -- every exercise -----------------------------------------------------------------------

# A tensor made without device= stays on the CPU on a GPU machine; the
# worker's device tracking shows where, on any machine.
test_would_run_on_a_gpu = portability_check([
    portable("rope_angles", lambda inputs: ((_positions(inputs, "gaps", (2, 5)), 8), {})),
    portable("apply_rope", lambda inputs: (_rope_inputs(inputs, ROPE_CASES[2]), {})),
    portable("apply_rope_half", lambda inputs: (_rope_inputs(inputs, ROPE_CASES[2]), {})),
    portable("adjacent_to_half_permutation", lambda inputs: ((8,), {"device": "cpu"})),
    portable("rope_self_attention", lambda inputs: (
        (lambda args, positions: (args, {"token_positions": positions}))(
            *_attention_inputs(inputs, ATTENTION_CASES[2])))),
])
