"""Chapter 7 (memory-efficient attention): the reference scores full marks and the stub zero;
correct code written otherwise (a split of the keys, a query-tiled loop) passes; naive
attention, which builds the (L, S) scores or an (L, S) mask, gets the right numbers and
fails the memory check alone, with the tensor's shape in the message; a softmax that takes
its max and sum over whole rows fails the online check alone; the worker's measurement of
the largest tensor leaves views out, and its widest reduction counts what one max, sum or
matrix product combines; and the lesson's numbers are the reference's."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from conftest import replace_function, result_of, solution_source, statuses, stub_source
from grader.bugs.ch07 import BUGS
from grader.catalog import COURSE_ROOT, find_chapter
from grader.compare import CheckFailure
from grader.known_bugs import apply_bug
from grader.remote import Footprint, Largest, Reduction, _footprint
from grader.sandbox import _Footprint

CH07 = find_chapter("ch07")
SOLUTION = solution_source(CH07)
LESSON = COURSE_ROOT / "chapters" / CH07.folder
MEMORY_CHECK = "at T = 2048 with blocks of 128, makes no tensor larger than (L, block) pieces: never (L, S)"
ONLINE_CHECK = "takes each max and sum over one block of a row, never over the whole row at once"


def _load(path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference():
    return _load(COURSE_ROOT / "solutions" / f"{CH07.module}.py", "reference_ch07_for_tests")


def _failed(report, exercise: str) -> dict[str, str]:
    """``{check title: message}`` of the exercise's failed checks."""
    return {check.check: check.message for check in result_of(report, exercise).failed_checks}


def test_solution_scores_full_marks_and_stub_scores_zero(grade_source):
    solved = grade_source(SOLUTION, chapter="ch07")
    assert solved.passed and solved.score == solved.max_score == 8
    stub = grade_source(stub_source(CH07), chapter="ch07")
    assert stub.score == 0
    assert set(statuses(stub).values()) == {"not implemented"}


# Correct code written otherwise: the keys split with torch.split, the state kept as
# log-sum-exp, the causal mask from a comparison of broadcast positions.
OTHER_STYLE_TILED = '''
def tiled_attention(q, k, v, block_size, causal=False):
    L, S = q.shape[-2], k.shape[-2]
    lse = q.new_full((*q.shape[:-1], 1), float("-inf"))
    out = q.new_zeros((*q.shape[:-1], v.shape[-1]))
    row = torch.arange(L, device=q.device).unsqueeze(-1) + S - L
    for index, (kb, vb) in enumerate(zip(k.split(block_size, dim=-2), v.split(block_size, dim=-2))):
        s = (q * q.shape[-1] ** -0.5) @ kb.mT
        if causal:
            col = index * block_size + torch.arange(kb.shape[-2], device=q.device)
            s = s.masked_fill(col > row, float("-inf"))
        block_lse = torch.logsumexp(s, dim=-1, keepdim=True)
        new_lse = torch.logaddexp(lse, block_lse)
        safe = torch.where(torch.isinf(new_lse), torch.zeros_like(new_lse), new_lse)
        out = out * torch.exp(lse - safe) + torch.exp(s - safe) @ vb
        lse = new_lse
    return out
'''


def test_correct_code_in_another_style_scores_full_marks(grade_source):
    source = replace_function(SOLUTION, "tiled_attention", OTHER_STYLE_TILED)
    report = grade_source(source, chapter="ch07")
    assert report.passed, [(r.exercise.name, r.reason) for r in report.exercises if r.status != "passed"]


NAIVE = '''
def tiled_attention(q, k, v, block_size, causal=False):
    L, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., L, S)
    if causal:
        mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril(S - L)
        scores = scores.masked_fill(~mask, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    m = m.masked_fill(torch.isneginf(m), 0.0)
    p = torch.exp(scores - m)
    l = p.sum(dim=-1, keepdim=True)
    return (p @ v) / l.masked_fill(l == 0, 1.0)
'''

# Blocks of keys, but the causal mask built whole: (L, S) booleans.
WHOLE_MASK = '''
def tiled_attention(q, k, v, block_size, causal=False):
    L, S = q.shape[-2], k.shape[-2]
    full = torch.ones(L, S, dtype=torch.bool, device=q.device).tril(S - L) if causal else None
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))
    l = torch.zeros_like(m)
    acc = q.new_zeros((*q.shape[:-1], v.shape[-1]))
    for start in range(0, S, block_size):
        s = q @ k[..., start:start + block_size, :].mT / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(~full[:, start:start + block_size], float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        shift = m_new.masked_fill(torch.isneginf(m_new), 0.0)
        p = torch.exp(s - shift)
        l = l * torch.exp(m - shift) + p.sum(dim=-1, keepdim=True)
        acc = acc * torch.exp(m - shift) + p @ v[..., start:start + block_size, :]
        m = m_new
    return acc / l.masked_fill(l == 0, 1.0)
'''


def test_naive_attention_fails_the_memory_check_only_and_names_the_tensor(grade_source):
    report = grade_source(replace_function(SOLUTION, "tiled_attention", NAIVE), chapter="ch07")
    failed = _failed(report, "tiled_attention")
    assert set(failed) == {f"{MEMORY_CHECK} [full]", f"{MEMORY_CHECK} [causal]"}
    message = failed[f"{MEMORY_CHECK} [full]"]
    assert "built a (1, 2048, 2048) tensor (4,194,304 numbers)" in message
    assert "keeps at most (2048, 128) at a time" in message
    assert statuses(report)["online_softmax"] == statuses(report)["merge_attention"] == "passed"


def test_a_whole_causal_mask_fails_the_causal_memory_check_only(grade_source):
    report = grade_source(replace_function(SOLUTION, "tiled_attention", WHOLE_MASK), chapter="ch07")
    failed = _failed(report, "tiled_attention")
    assert set(failed) == {f"{MEMORY_CHECK} [causal]"}
    assert "built a (2048, 2048) tensor (4,194,304 numbers)" in failed[f"{MEMORY_CHECK} [causal]"]


def test_the_largest_tensor_leaves_views_out():
    x = torch.randn(4, 1)
    with _Footprint() as measure:
        x.expand(4, 1000)  # a view: no new memory
        y = x * 2
    assert measure.largest == {"shape": [4, 1], "numel": 4, "bytes": 16}
    with _Footprint() as measure:
        x.expand(4, 1000).contiguous()
    assert measure.largest["shape"] == [4, 1000]
    del y


@pytest.mark.parametrize("length, keys, block_size", [(6, 10, 3), (10, 10, 4), (12, 10, 3)])
def test_the_reference_keeps_to_its_blocks(length, keys, block_size):
    reference = _reference()
    q, k, v = torch.randn(2, length, 4), torch.randn(2, keys, 4), torch.randn(2, keys, 4)
    for causal in (False, True):
        with _Footprint() as measure:
            reference.tiled_attention(q, k, v, block_size, causal=causal)
        assert measure.largest["numel"] <= 2 * length * max(block_size, 4)
        assert measure.widest["width"] <= max(block_size, 4)  # a block of keys, or the features
    with _Footprint() as measure:
        reference.online_softmax(torch.randn(3, keys), block_size)
    assert measure.widest["width"] == block_size


@pytest.mark.parametrize("call, op, width", [
    (lambda x: x.amax(dim=-1), "amax", 1000),
    (lambda x: x[:, :64].sum(dim=-1, keepdim=True), "sum", 64),
    (lambda x: x.max(), "max", 4000),  # no dim: every entry
    (lambda x: x.sort(), "sort", 1000),  # dim left at its default, -1
    (lambda x: torch.logsumexp(x, dim=0), "logsumexp", 4),
    (lambda x: x @ torch.ones(1000), "mv", 1000),  # a matrix product sums too
    (lambda x: torch.einsum("ij,kj->ik", x, x), "bmm", 1000),
])
def test_the_widest_reduction_counts_what_one_result_combines(call, op, width):
    with _Footprint() as measure:
        call(torch.randn(4, 1000))
    assert (measure.widest["op"], measure.widest["width"]) == (op, width)


def test_elementwise_work_and_views_are_no_reduction():
    x = torch.randn(4, 1000)
    with _Footprint() as measure:
        torch.maximum(x[:, 0], x[:, 1])
        torch.max(x[:, 0], x[:, 1])  # aten::max.other, elementwise despite its name
        torch.exp(x - 1).div(3).transpose(0, 1)
    assert measure.widest is None



@pytest.mark.parametrize("found", [
    None, [], {"largest": {"shape": [2], "numel": -1}, "reduction": None},
    {"largest": None, "reduction": {"op": "amax", "width": "all", "shape": [4]}},
    {"largest": None, "reduction": {"op": 3, "width": 4, "shape": [4]}},
])
def test_a_malformed_measurement_from_the_worker_is_refused(found):
    with pytest.raises(CheckFailure, match="malformed measurement"):
        _footprint("online_softmax(x (4, 8), 2)", found)
    measured = _footprint("call", {"largest": {"shape": [4, 8], "numel": 32},
                                   "reduction": {"op": "sum", "width": 2, "shape": [4, 2]}})
    assert measured == Footprint(Largest((4, 8), 32), Reduction("sum", 2, (4, 2)))

def test_a_softmax_over_whole_rows_fails_the_online_check_alone(grade_source):
    bug = next(bug for bug in BUGS if bug.name == "whole-row-at-once")
    report = grade_source(apply_bug(SOLUTION, bug), chapter="ch07")
    failed = result_of(report, "online_softmax").failed_checks
    assert [check.check for check in failed] == [ONLINE_CHECK]
    assert "ran a max (amax) over 1,000 numbers at once (of a (4, 1000) tensor)" in failed[0].message
    assert "read one block of 64 at a time" in failed[0].message and failed[0].hint == bug.hint
    assert statuses(report)["tiled_attention"] == statuses(report)["merge_attention"] == "passed"


def test_the_reference_is_pytorchs_attention_with_chapter_4s_mask():
    tiled = _reference().tiled_attention
    causal_mask = _load(COURSE_ROOT / "solutions" / "ch04_causal_attention.py", "reference_ch04_for_ch07").causal_mask
    for length, keys in [(4, 10), (10, 10), (12, 10)]:
        q, k, v = (torch.randn(2, n, 8, dtype=torch.float64) for n in (length, keys, keys))
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(length, keys))
        torch.testing.assert_close(tiled(q, k, v, 3, causal=True), expected)


def test_the_lessons_worked_example_is_the_reference():
    reference = _reference()
    x = torch.tensor([[1.0, 3.0, 2.0, 5.0]], dtype=torch.float64)
    lesson = (LESSON / "README.md").read_text(encoding="utf-8")
    total = float(torch.exp(x - 5).sum())
    assert f"{total:.4f}" in lesson
    assert f"{float(torch.exp(x[0, :2] - 3).sum()):.4f}" in lesson
    torch.testing.assert_close(reference.online_softmax(x, 2), torch.softmax(x, dim=-1))
