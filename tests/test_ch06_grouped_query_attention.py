"""Chapter 6 (grouped-query attention): the reference scores full marks and the stub zero;
correct code written the way Hugging Face and PyTorch write it passes too (expand and
reshape, a grouped view with no copy, enable_gqa); the head-order checks name the K/V head
a query head used; a grouped view whose mask is not reshaped fails the mask checks; the
enable_gqa check skips on a torch without it; and the lesson's numbers are the reference's."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from conftest import Draw, replace_function, result_of, solution_source, statuses, stub_source
from grader.catalog import COURSE_ROOT, find_chapter
from grader.known_bugs import KNOWN_BUGS, apply_bug

CH06 = find_chapter("ch06")
SOLUTION = solution_source(CH06)
LESSON = COURSE_ROOT / "chapters" / CH06.folder


def _load(path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference():
    return _load(CH06.solution(), "reference_ch06_for_tests")


def _bug(exercise: str, name: str):
    return next(bug for bug in KNOWN_BUGS["ch06"] if bug.exercise == exercise and bug.name == name)


def _failed(report, exercise: str) -> dict[str, str]:
    """``{check title: message}`` of the exercise's failed checks."""
    return {check.check: check.message for check in result_of(report, exercise).failed_checks}


def test_solution_scores_full_marks_and_stub_scores_zero(grade_source):
    solved = grade_source(SOLUTION, chapter="ch06")
    assert solved.passed and solved.score == solved.max_score == 9
    stub = grade_source(stub_source(CH06), chapter="ch06")
    assert stub.score == 0
    assert set(statuses(stub).values()) == {"not implemented"}


# Correct code in other people's style: Hugging Face's repeat_kv (expand, then reshape), a
# grouped view of the queries that never copies K and V (its masks reshaped to match), NaN
# turned into zeros afterwards, PyTorch's enable_gqa in the module, element_size for bytes.
OTHER_STYLE = '''
import torch
import torch.nn.functional as F
from torch import nn


def expand_kv_heads(kv, num_query_heads):
    batch, num_kv_heads, slen, head_dim = kv.shape
    if num_query_heads % num_kv_heads != 0:
        raise ValueError("num_query_heads must be a multiple of the K/V heads")
    n_rep = num_query_heads // num_kv_heads
    hidden = kv[:, :, None, :, :].expand(batch, num_kv_heads, n_rep, slen, head_dim)
    return hidden.reshape(batch, num_kv_heads * n_rep, slen, head_dim)


def grouped_query_attention(q, k, v, mask=None):
    batch, n_heads, qlen, head_dim = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv
    grouped = q.view(batch, n_kv, group, qlen, head_dim)
    scores = grouped @ k[:, :, None].transpose(-2, -1) * head_dim ** -0.5  # (B, H_kv, g, L, S)
    if mask is not None:
        if mask.dim() == 4 and mask.shape[1] == n_heads:
            mask = mask.view(mask.shape[0], n_kv, group, *mask.shape[2:])
        elif mask.dim() == 4:
            mask = mask[:, :, None]
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    output = weights @ v[:, :, None]  # (B, H_kv, g, L, d_v)
    return output.flatten(1, 2), weights.flatten(1, 2)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, num_heads, num_kv_heads, bias=False):
        super().__init__()
        if d_model % num_heads or num_heads % num_kv_heads:
            raise ValueError("heads do not divide")
        self.n_heads, self.n_kv_heads = num_heads, num_kv_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias)

    def forward(self, x, mask=None):
        bsz, seqlen, _ = x.shape
        xq = self.q_proj(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xk = self.k_proj(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        xv = self.v_proj(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(xq, xk, xv, attn_mask=mask, enable_gqa=True)
        return self.out_proj(out.transpose(1, 2).contiguous().view(bsz, seqlen, -1))


def kv_cache_bytes(batch, seq_len, num_layers, num_kv_heads, head_dim, dtype):
    bytes_per_number = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * batch * seq_len * num_kv_heads * head_dim * bytes_per_number
'''


@pytest.mark.parametrize("seed", [1, 2])
def test_correct_code_in_hugging_face_and_pytorch_style_scores_full_marks(grade_source, seed):
    report = grade_source(OTHER_STYLE, chapter="ch06", seed=seed)
    assert report.passed, [(r.exercise.name, r.reason) for r in report.exercises if r.status != "passed"]


# -- the reference is PyTorch's grouped-query attention ----------------------------------------


@pytest.mark.parametrize("num_query_heads, num_kv_heads", [(4, 4), (4, 2), (6, 3), (8, 2), (8, 1)],
                         ids=["MHA", "groups-of-2", "groups-of-2-H3", "groups-of-4", "MQA"])
def test_the_reference_is_pytorchs_grouped_query_attention(num_query_heads, num_kv_heads):
    torch.manual_seed(6)
    reference = _reference()
    group = num_query_heads // num_kv_heads
    q = torch.randn(2, num_query_heads, 5, 8, dtype=torch.float64)
    k = torch.randn(2, num_kv_heads, 7, 8, dtype=torch.float64)
    v = torch.randn(2, num_kv_heads, 7, 3, dtype=torch.float64)
    mask = torch.rand(2, 1, 5, 7) < 0.7
    mask[..., 0] = True
    output, weights = reference.grouped_query_attention(q, k, v, mask=mask)
    expanded = [t.repeat_interleave(group, dim=1) for t in (k, v)]
    torch.testing.assert_close(output, F.scaled_dot_product_attention(q, *expanded, attn_mask=mask))
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2, num_query_heads, 5, dtype=torch.float64))
    grouped = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(output, grouped)


def test_the_reference_kv_cache_is_the_lessons():
    reference = _reference()
    lesson = (LESSON / "README.md").read_text(encoding="utf-8")
    per_token = {32: "524,288", 8: "131,072", 1: "16,384"}  # LLaMA-3-8B-like, bfloat16
    for num_kv_heads, text in per_token.items():
        assert f"{reference.kv_cache_bytes(1, 1, 32, num_kv_heads, 128, torch.bfloat16):,}" == text
        assert text in lesson
    assert f"{reference.kv_cache_bytes(1, 1, 80, 8, 128, torch.bfloat16):,}" == "327,680"  # 70B
    gib = {num_kv_heads: reference.kv_cache_bytes(8, 8192, 32, num_kv_heads, 128, torch.bfloat16) / 2**30
           for num_kv_heads in (32, 8, 1)}
    assert gib == {32: 32, 8: 8, 1: 1}  # the figure's bars and section 1's batch of 8
    with torch.device("meta"):
        module = reference.GroupedQueryAttention(4096, 32, 8)
    assert f"{sum(p.numel() for p in module.parameters()):,}" in lesson  # 41,943,040


# -- the head-order checks say which K/V head a query head used --------------------------------


@pytest.mark.parametrize("exercise, title", [
    ("expand_kv_heads", "head h of the result is K/V head h // group"),
    ("grouped_query_attention", "query head h attends with K/V head h // group"),
])
def test_tiling_is_caught_by_the_head_order_check_which_names_the_head(grade_source, exercise, title):
    report = grade_source(apply_bug(SOLUTION, _bug(exercise, "tiled")), chapter="ch06")
    failed = {name: message for name, message in _failed(report, exercise).items() if name.startswith(title)}
    assert failed
    assert all("query head 1 uses K/V head 1; expected K/V head 0 = 1 // " in m for m in failed.values())
    hints = {check.hint for check in result_of(report, exercise).failed_checks}
    assert _bug(exercise, "tiled").hint in hints


def test_tiling_by_hand_is_named_though_written_otherwise(grade_source):
    # The group axis put before the K/V heads: Hugging Face's expand with the axes swapped.
    source = replace_function(SOLUTION, "expand_kv_heads", '''
def expand_kv_heads(kv, num_query_heads):
    batch, num_kv_heads, length, width = kv.shape
    if num_query_heads % num_kv_heads:
        raise ValueError("not a multiple")
    group = num_query_heads // num_kv_heads
    return kv[:, None].expand(batch, group, num_kv_heads, length, width).reshape(batch, -1, length, width)
''')
    report = grade_source(source, chapter="ch06")
    assert result_of(report, "expand_kv_heads").reason.startswith(_bug("expand_kv_heads", "tiled").hint)
    assert statuses(report)["kv_cache_bytes"] == "passed"


# -- wrong code that is not a known bug still fails, and says where ---------------------------------


def test_a_grouped_view_whose_mask_is_not_reshaped_fails_the_mask_checks(grade_source):
    # Queries viewed as (B, H_kv, group, L, d), scores (B, H_kv, group, L, S), and the mask
    # left as it came: (L, S) still broadcasts right, (B, 1, L, S) lines B up with H_kv.
    source = replace_function(SOLUTION, "grouped_query_attention", '''
def grouped_query_attention(q, k, v, mask=None):
    batch, num_query_heads, length, width = q.shape
    num_kv_heads = k.shape[1]
    grouped = q.view(batch, num_kv_heads, num_query_heads // num_kv_heads, length, width)
    scores = grouped @ k[:, :, None].transpose(-2, -1) / math.sqrt(width)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights @ v[:, :, None]).flatten(1, 2), weights.flatten(1, 2)
''')
    report = grade_source(source, chapter="ch06")
    failed = _failed(report, "grouped_query_attention")
    masked = {title for title in failed if title.startswith("with a mask broadcast over the query heads")}
    assert {title.rsplit("[", 1)[1].rstrip("]") for title in masked} == {"B-1-L-S", "B-Hq-L-S", "B-1-1-S"}
    assert not any(title.startswith("matches the reference") for title in failed)  # right without masks
    assert "mask (2, 1, 5, 7) bool" in "\n".join(failed.values())  # the message shows the mask's shape
    assert statuses(report)["expand_kv_heads"] == "passed"


def test_a_module_that_mixes_up_heads_in_the_output_fails_only_the_module(grade_source):
    # The heads' outputs merged without moving the heads axis behind the tokens.
    source = SOLUTION.replace(
        "return self.out_proj(heads.transpose(1, 2).reshape(batch, length, -1))",
        "return self.out_proj(heads.reshape(batch, length, -1))")
    assert source != SOLUTION
    report = grade_source(source, chapter="ch06")
    assert {name for name, status in statuses(report).items() if status != "passed"} == {"GroupedQueryAttention"}
    assert "nn.MultiheadAttention" in "\n".join(_failed(report, "GroupedQueryAttention"))


# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py); a class's args
    are ``(init args, call args, call kwargs)``."""
    q, k, v = draw.randn(2, 6, 4, 3), draw.randn(2, 2, 5, 3), draw.randn(2, 2, 5, 2)
    return [
        ("expand_kv_heads", (draw.randn(2, 2, 5, 3), 6), {}),
        ("grouped_query_attention", (q, k, v), {}),
        ("grouped_query_attention", (q, k, v), {"mask": draw.mask(4, 5)}),
        ("GroupedQueryAttention", ((12, 6, 2), (draw.randn(2, 5, 12),), {"mask": draw.mask(5, 5)}), {}),
        ("kv_cache_bytes", (2, 128, 4, 2, 64, torch.bfloat16), {}),
    ]


# The known bug tests/test_release.py makes in the edition and in this tree.
RELEASE_BUG = ("grouped_query_attention", "tiled")
