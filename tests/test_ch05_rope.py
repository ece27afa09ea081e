"""Chapter 5 (RoPE): the reference scores full marks and the stub zero; correct code written
the way Meta and Hugging Face write it passes too; the property checks catch what they
promise; wrong implementations that are not known bugs fail with a useful message; and the
course's promise "chapter 5 matches the complex-multiplication oracle at shuffled positions"."""

import importlib.util
import math

import pytest
import torch

from conftest import Draw, replace_function, result_of, solution_source, statuses, stub_source
from grader.catalog import find_chapter
from grader.known_bugs import KNOWN_BUGS, apply_bug

CH05 = find_chapter("ch05")
SOLUTION = solution_source(CH05)


def _reference():
    path = CH05.solution()
    spec = importlib.util.spec_from_file_location("reference_ch05_for_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bug(exercise: str, name: str):
    return next(bug for bug in KNOWN_BUGS["ch05"] if bug.exercise == exercise and bug.name == name)


def _failed_titles(report, exercise: str) -> list[str]:
    return [check.check for check in result_of(report, exercise).failed_checks]


def _messages(report, exercise: str) -> str:
    return "\n".join(check.message for check in result_of(report, exercise).failed_checks)


def test_solution_scores_full_marks_and_stub_scores_zero(grade_source):
    solved = grade_source(SOLUTION, chapter="ch05")
    assert solved.passed and solved.score == solved.max_score == 10
    stub = grade_source(stub_source(CH05), chapter="ch05")
    assert stub.score == 0
    assert set(statuses(stub).values()) == {"not implemented"}


# Correct code in other people's style: complex numbers (Meta's LLaMA), rotate_half with
# cos and sin cast to the input's dtype (Hugging Face, which multiplies in float16),
# frequencies in float64, PyTorch's attention. The tolerances must let all of it pass.
OTHER_STYLE = '''
import torch
import torch.nn.functional as F


def rope_angles(token_positions, head_dim, theta=10000.0):
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64,
                                            device=token_positions.device) / head_dim)
    return token_positions[..., None].float() * inv_freq.float()


def apply_rope(x, token_positions, theta=10000.0):
    angles = rope_angles(token_positions, x.shape[-1], theta)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * freqs_cis).flatten(-2).type_as(x)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope_half(x, token_positions, theta=10000.0):
    freqs = rope_angles(token_positions, x.shape[-1], theta)
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)


def adjacent_to_half_permutation(head_dim, device=None):
    return torch.arange(head_dim, device=device).view(head_dim // 2, 2).t().flatten()


def rope_self_attention(d_model, num_heads, max_seq_len, theta, w_q, w_k, w_v, w_o, x,
                        token_positions=None):
    *batch, T, _ = x.shape
    d = d_model // num_heads
    if token_positions is None:
        token_positions = torch.arange(T, device=x.device)

    def split(t):
        return t.view(*batch, T, num_heads, d).transpose(-3, -2)

    q, k, v = split(F.linear(x, w_q)), split(F.linear(x, w_k)), split(F.linear(x, w_v))
    q = apply_rope(q, token_positions[..., None, :], theta)
    k = apply_rope(k, token_positions[..., None, :], theta)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(out.transpose(-3, -2).reshape(*batch, T, d_model), w_o)
'''


@pytest.mark.parametrize("seed", [1, 2])
def test_correct_code_in_meta_and_hugging_face_style_scores_full_marks(grade_source, seed):
    report = grade_source(OTHER_STYLE, chapter="ch05", seed=seed)
    assert report.passed, [(r.exercise.name, r.reason) for r in report.exercises if r.status != "passed"]


# -- acceptance: chapter 5 matches the complex-multiplication oracle at shuffled positions ------------


def _complex_oracle(x, positions, theta=10000.0):
    """Meta's LLaMA, written here: adjacent pairs as complex numbers times polar(1, angle)."""
    d = x.shape[-1]
    frequencies = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.float()[..., None] * frequencies.float()
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], d // 2, 2))
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


@pytest.mark.parametrize("x_shape, positions_shape", [((9, 8), (9,)), ((3, 7, 16), (3, 7)),
                                                      ((2, 4, 5, 6), (2, 1, 5))],
                         ids=["T9-d8", "B3-T7-d16", "B2-H4-T5-d6"])
def test_chapter_5_matches_the_complex_multiplication_oracle_at_shuffled_positions(x_shape, positions_shape):
    torch.manual_seed(5)
    reference = _reference()
    x = torch.randn(x_shape)
    rows = [torch.randperm(90)[: positions_shape[-1]] for _ in range(math.prod(positions_shape[:-1]))]
    positions = torch.stack(rows).reshape(positions_shape)  # distinct positions below 90, in any order
    assert not bool((positions.diff(dim=-1) == 1).all())  # really shuffled, not 0 .. T-1
    torch.testing.assert_close(reference.apply_rope(x, positions), _complex_oracle(x, positions))
    perm = reference.adjacent_to_half_permutation(x_shape[-1])
    torch.testing.assert_close(reference.apply_rope_half(x[..., perm], positions),
                               _complex_oracle(x, positions)[..., perm])


def test_the_graded_oracle_check_runs_at_shuffled_positions_and_catches_ignored_positions(grade_source):
    oracle_checks = [check for check in result_of(grade_source(SOLUTION, chapter="ch05"), "apply_rope").checks
                     if check.check.startswith("matches complex multiplication")]
    assert any("shuffled" in check.check for check in oracle_checks)
    assert all(check.outcome == "passed" for check in oracle_checks)
    ignores_positions = replace_function(SOLUTION, "apply_rope", '''
def apply_rope(x, token_positions, theta=10000.0):
    d = x.shape[-1]
    angles = torch.arange(x.shape[-2], device=x.device)[:, None] * theta ** (
        -torch.arange(0, d, 2, device=x.device) / d)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.stack([even * angles.cos() - odd * angles.sin(),
                       even * angles.sin() + odd * angles.cos()], dim=-1)
    return out.flatten(-2).to(x.dtype)
''')
    report = grade_source(ignores_positions, chapter="ch05")
    failed = _failed_titles(report, "apply_rope")
    assert any(title.startswith("matches complex multiplication") and "shuffled" in title for title in failed)
    hints = {check.hint for check in result_of(report, "apply_rope").failed_checks}
    assert _bug("apply_rope", "positions-ignored").hint in hints  # it tells the student what is wrong


# -- the property checks catch what they promise -------------------------------------------------


@pytest.mark.parametrize("exercise, bug, property_check", [
    # the mix of the lesson (section 6): rotate-half pairs with repeat_interleave'd frequencies
    ("apply_rope_half", "frequencies-interleaved", "q_m . k_n depends only on m - n"),
    ("apply_rope_half", "frequencies-interleaved", "keeps the length of every vector"),
    # the mirror mix: adjacent pairs with the angles laid out cat([a, a])
    ("apply_rope", "frequencies-concatenated", "q_m . k_n depends only on m - n"),
    ("apply_rope", "frequencies-concatenated", "keeps the length of every vector"),
    ("apply_rope", "cos-sin-swapped", "leaves vectors at position 0 unchanged"),
    ("rope_self_attention", "rope-on-values", "shifting every position by the same amount"),
    ("rope_self_attention", "keys-not-rotated", "shifting every position by the same amount"),
    ("rope_self_attention", "not-causal", "changing later tokens changes no earlier output"),
], ids=["interleaved-relative", "interleaved-norms", "concatenated-relative", "concatenated-norms",
        "swapped-identity", "values-offset", "keys-offset",
        "not-causal"])
def test_property_checks_fail_the_bugs_that_break_them(grade_source, exercise, bug, property_check):
    report = grade_source(apply_bug(SOLUTION, _bug(exercise, bug)), chapter="ch05")
    assert any(title.startswith(property_check) for title in _failed_titles(report, exercise))


# -- wrong code that is not a known bug still fails, and says where ---------------------------------


def test_angles_computed_in_float16_fail_at_large_positions(grade_source):
    # A student who saves memory with half-precision angles and casts back at the end:
    # exact below position 2048 for pair 0, off by whole radians beyond.
    source = replace_function(SOLUTION, "rope_angles", '''
def rope_angles(token_positions, head_dim, theta=10000.0):
    k = torch.arange(head_dim // 2, device=token_positions.device, dtype=torch.float16)
    frequencies = theta ** (-2 * k / head_dim)
    return (token_positions.to(torch.float16).unsqueeze(-1) * frequencies).float()
''')
    report = grade_source(source, chapter="ch05")
    assert result_of(report, "rope_angles").status == "failed"
    assert "rope_angles(token_positions" in _messages(report, "rope_angles")
    assert "max abs error" in _messages(report, "rope_angles")
    assert any("theta^(-2k/d)" in title for title in _failed_titles(report, "rope_angles"))
    assert result_of(report, "rope_angles").reason.startswith(
        _bug("rope_angles", "positions-in-half-precision").hint)  # named, though written otherwise


def test_attention_that_drops_theta_fails_where_theta_is_not_10000(grade_source):
    source = SOLUTION.replace("q, k = apply_rope(q, positions, theta), apply_rope(k, positions, theta)",
                              "q, k = apply_rope(q, positions), apply_rope(k, positions)")
    assert source != SOLUTION
    report = grade_source(source, chapter="ch05")
    assert result_of(report, "rope_self_attention").status == "failed"
    assert "500000.0" in _messages(report, "rope_self_attention")  # the call shows the theta it was given
    failing = {name for name, status in statuses(report).items() if status != "passed"}
    assert failing == {"rope_self_attention"}


def test_causal_mask_by_position_instead_of_token_order_fails_at_shuffled_positions(grade_source):
    # The docstring: the causal mask follows the order of the tokens in x, whatever
    # their positions. Masking by position instead agrees only while positions increase.
    source = SOLUTION.replace(
        "blocked = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(diagonal=1)",
        "blocked = (token_positions.unsqueeze(-1) < token_positions.unsqueeze(-2)).unsqueeze(-3)")
    assert source != SOLUTION
    report = grade_source(source, chapter="ch05")
    assert result_of(report, "rope_self_attention").status == "failed"
    failed = _failed_titles(report, "rope_self_attention")
    assert failed and all("shuffled" in title for title in failed)
    assert "shuffled positions" in _messages(report, "rope_self_attention")


def test_positions_read_as_an_offset_pass_offsets_and_fail_gaps_and_shuffles(grade_source):
    # Decoding code that keeps only where the chunk starts: right for 41, 42, 43, ...
    source = replace_function(SOLUTION, "apply_rope", '''
def apply_rope(x, token_positions, theta=10000.0):
    start = token_positions[..., :1]  # where the chunk begins
    positions = start + torch.arange(x.shape[-2], device=x.device)
    angles = rope_angles(positions, x.shape[-1], theta)
    pairs = x.to(torch.promote_types(x.dtype, torch.float32)).unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = angles.cos().to(pairs.dtype), angles.sin().to(pairs.dtype)
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2).to(x.dtype)
''')
    report = grade_source(source, chapter="ch05")
    result = result_of(report, "apply_rope")
    checks = {check.check: check.outcome for check in result.checks}
    assert checks["matches complex multiplication (Meta's LLaMA: view_as_complex times polar(1, angle)) "
                  "[T7-d8-offset]"] == "passed"
    failed = [title for title in _failed_titles(report, "apply_rope") if title.startswith("matches")]
    assert failed and all("gaps" in title or "shuffled" in title for title in failed)
    assert result.reason.startswith(_bug("apply_rope", "positions-as-offset").hint)


# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py); a class's args
    are ``(init args, call args, call kwargs)``."""
    x, positions = draw.randn(2, 5, 8), draw.positions(2, 5)
    attention = (16, 2, 32, 10000.0, *(draw.weights(16, 16) for _ in range(4)), draw.randn(2, 6, 16))
    return [
        ("rope_angles", (positions, 8), {}),
        ("apply_rope", (x, positions), {}),
        ("apply_rope", (draw.randn(3, 4, 6, dtype=torch.float64), draw.positions(4)), {"theta": 500.0}),
        ("apply_rope_half", (x, positions), {}),
        ("adjacent_to_half_permutation", (8,), {}),
        ("rope_self_attention", attention, {}),
        ("rope_self_attention", attention, {"token_positions": draw.positions(2, 6)}),
    ]


# The known bug tests/test_release.py makes in the edition and in this tree.
RELEASE_BUG = ("apply_rope", "pairs-are-halves")
