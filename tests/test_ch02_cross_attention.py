"""Chapter 2's checks: the reference passes, the stub scores nothing, other
correct ways of writing the exercises pass, and the chapter's pitfalls fail
with feedback that says what to fix."""

import importlib.util
import re

import pytest
import torch

from conftest import Draw, replace_function, result_of, solution_source, statuses, stub_source
from grader.catalog import COURSE_ROOT, find_chapter
from grader.known_bugs import KNOWN_BUGS, apply_bug

CH02 = find_chapter("ch02")
SOLUTION = solution_source(CH02)
LESSON = COURSE_ROOT / "chapters" / CH02.folder


def _bug(name: str):
    return next(bug for bug in KNOWN_BUGS["ch02"] if bug.name == name)


def _messages(result) -> str:
    return "\n".join(f"{check.message} {check.hint or ''}" for check in result.failed_checks)


def test_the_solution_scores_full_marks_and_the_stub_nothing(grade_source):
    report = grade_source(SOLUTION, chapter="ch02")
    assert report.score == report.max_score == 8, statuses(report)
    stub = grade_source(stub_source(CH02), chapter="ch02")
    assert stub.score == 0
    assert set(statuses(stub).values()) == {"not implemented"}


# Correct answers written differently from the reference: a loop, torch.where,
# expand, PyTorch's own attention. The checks judge behaviour, not the code.
OTHER_CORRECT_WAYS = {
    "padding_mask": '''
def padding_mask(lengths, max_len=None):
    size = int(lengths.max()) if max_len is None else max_len
    mask = torch.zeros(len(lengths), size, dtype=torch.bool, device=lengths.device)
    for b, length in enumerate(lengths.tolist()):
        mask[b, :length] = True
    return mask
''',
    "convert_mask": '''
def convert_mask(mask, source, target, dtype=torch.float32):
    readers = {"attend": lambda m: m, "block": lambda m: ~m, "additive": lambda m: m != float("-inf")}
    if source not in readers or target not in readers:
        raise ValueError(f"unknown convention: {source}, {target}")
    attend = readers[source](mask)
    if target == "additive":
        zero = torch.tensor(0.0, dtype=dtype, device=mask.device)
        return torch.where(attend, zero, torch.tensor(float("-inf"), dtype=dtype, device=mask.device))
    return attend if target == "attend" else ~attend
''',
    "combine_masks": '''
def combine_masks(key_padding, attn_mask=None):
    batch, keys = key_padding.shape
    if attn_mask is None:
        return key_padding.view(batch, 1, 1, keys)
    attn_mask = attn_mask.expand(batch, -1, -1)  # (L, S) or (B, L, S) -> (B, L, S)
    return torch.logical_and(key_padding.view(batch, 1, 1, keys), attn_mask[:, None])
''',
    "cross_attention": '''
def cross_attention(x, context, w_q, w_k, w_v, context_lengths=None):
    import torch.nn.functional as F
    q, k, v = F.linear(x, w_q), F.linear(context, w_k), F.linear(context, w_v)
    mask = None
    if context_lengths is not None:
        mask = padding_mask(context_lengths, context.shape[1])[:, None, :]  # (B, 1, S)
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = torch.where(mask, scores, float("-inf"))
    empty = ~torch.isfinite(scores).any(dim=-1, keepdim=True)
    weights = torch.where(empty, 0.0, torch.softmax(torch.where(empty, 0.0, scores), dim=-1))
    return output, weights
''',
}


def test_other_correct_ways_score_full_marks(grade_source):
    source = SOLUTION
    for name, definition in OTHER_CORRECT_WAYS.items():
        source = replace_function(source, name, definition)
    report = grade_source(source, chapter="ch02")
    failures = {r.exercise.name: _messages(r) for r in report.exercises if r.status != "passed"}
    assert not failures


def test_a_mask_missing_its_query_axis_is_silently_wrong_when_b_equals_l_and_named(grade_source):
    bug = _bug("padding-mask-without-query-axis")
    report = grade_source(apply_bug(SOLUTION, bug), chapter="ch02")
    failed = {check.check: check for check in result_of(report, "cross_attention").failed_checks}
    # B == L == 3: the (B, S) mask broadcasts against (B, L, S), and the values are wrong.
    silent = failed["matches the reference [B3-L3-S6-dx4-dc5-dk4-dv5-padded]"]
    assert "max abs error" in silent.message and silent.hint == bug.hint
    assert "(B, 1, S)" in silent.hint and "B == L" in silent.hint
    # B != L: the same line raises, and the student sees where.
    loud = failed["matches the reference [B2-L3-S5-dx6-dc4-dk8-dv3-padded]"]
    assert "raised RuntimeError" in loud.message and "masked_fill" in loud.message
    assert loud.hint == bug.hint  # the first failure a student sees names the mistake too


def test_padding_on_the_query_axis_is_named_where_it_raises_too(grade_source):
    # torch.where with a trailing None: the (B, S, 1) mask hides queries. It
    # raises where L != S, and gives wrong values where L == S; both say why.
    source = replace_function(SOLUTION, "cross_attention", '''
def cross_attention(x, context, w_q, w_k, w_v, context_lengths=None):
    q, k, v = x @ w_q.T, context @ w_k.T, context @ w_v.T
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if context_lengths is not None:
        real = padding_mask(context_lengths, context.shape[1])
        scores = torch.where(real[:, :, None], scores, float("-inf"))
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return weights @ v, weights
''')
    result = result_of(grade_source(source, chapter="ch02"), "cross_attention")
    hint = _bug("padding-hides-queries").hint
    assert result.status == "failed" and result.reason.startswith(hint)
    failed = {check.check: check for check in result.failed_checks}
    loud = failed["matches the reference [B2-L3-S5-dx6-dc4-dk8-dv3-padded]"]
    assert "raised RuntimeError" in loud.message and "real[:, :, None]" in loud.message
    assert loud.hint == hint
    silent = failed["matches the reference [B2-L4-S4-dx5-dc5-dk3-dv2-padded]"]
    assert "max abs error" in silent.message and silent.hint == hint


def test_weights_from_a_plain_softmax_give_nan_for_an_empty_context(grade_source):
    # PyTorch's attention gives the right output (zeros), but the weights are
    # computed with a plain softmax: NaN for the sequence whose context is empty.
    source = replace_function(SOLUTION, "cross_attention", '''
def cross_attention(x, context, w_q, w_k, w_v, context_lengths=None):
    import torch.nn.functional as F
    q, k, v = x @ w_q.T, context @ w_k.T, context @ w_v.T
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = None
    if context_lengths is not None:
        mask = padding_mask(context_lengths, context.shape[-2]).unsqueeze(-2)  # (B, 1, S)
        scores = scores.masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), torch.softmax(scores, dim=-1)
''')
    report = grade_source(source, chapter="ch02")
    result = result_of(report, "cross_attention")
    assert result.status == "failed"
    assert [s for n, s in statuses(report).items() if n != "cross_attention"] == ["passed"] * 3
    empty = next(check for check in result.failed_checks if "empty" in check.check)
    assert "has NaN" in empty.message and "empty context" in empty.message
    # The known bug that gives these weights gives NaN outputs too, so it does not explain this
    # answer (its output is right); the relation of NaN rows where 0 belongs names the mistake.
    assert empty.relation == "nan_rows" and "weights (and output) should be 0" in empty.hint


def test_weights_that_hold_nan_are_said_to_hold_nan(grade_source):
    # An inverted padding mask hides every key of a full-length context, and the
    # plain softmax gives that query NaN: the property check and the check
    # against the student's own earlier answer name it, instead of "not exactly
    # 0 on padded keys" and "max abs error inf (expected nan, got nan)".
    source = apply_bug(apply_bug(SOLUTION, _bug("padding-mask-inverted")), _bug("nan-for-empty-context"))
    report = grade_source(source, chapter="ch02", only={"cross_attention"})
    messages = {check.check: check.message for check in result_of(report, "cross_attention").failed_checks}
    for title in ("weights are 0 on padded keys and each query's weights sum to 1 over the real keys",
                  "changing the padded context tokens changes nothing"):
        message = messages[title]
        assert "NaN at [" in message and "every key of that query masked" in message, message
        assert "max abs error" not in message and "not exactly 0" not in message


def test_combined_mask_for_three_dimensional_scores_is_refused(grade_source):
    # (B, 1, S) & attn_mask gives (B, L, S): right for chapter 1's (B, L, S)
    # scores, but against (B, H, L, S) the batch axis meets the heads.
    source = replace_function(SOLUTION, "combine_masks", '''
def combine_masks(key_padding, attn_mask=None):
    combined = key_padding.unsqueeze(1)  # (B, 1, S)
    if attn_mask is not None:
        combined = combined & attn_mask  # (B, L, S)
    return combined
''')
    report = grade_source(source, chapter="ch02")
    result = result_of(report, "combine_masks")
    assert result.status == "failed"
    messages = _messages(result)
    assert "expected (2, 1, 1, 5)" in messages  # the shape it should have
    assert "(B, H, L, S)" in messages and "does not broadcast" in messages
    assert _bug("no-head-axis").hint in [check.hint for check in result.failed_checks]


def test_a_padding_mask_of_ones_and_zeros_is_refused_with_its_dtype(grade_source):
    source = replace_function(SOLUTION, "padding_mask", '''
def padding_mask(lengths, max_len=None):
    size = int(lengths.max()) if max_len is None else max_len
    mask = torch.zeros(len(lengths), size, device=lengths.device)
    for b, length in enumerate(lengths.tolist()):
        mask[b, :length] = 1.0
    return mask
''')
    report = grade_source(source, chapter="ch02")
    result = result_of(report, "padding_mask")
    assert result.status == "failed"
    assert "has dtype torch.float32, expected torch.bool" in _messages(result)
    assert result_of(report, "cross_attention").status == "failed"  # it builds on padding_mask
    assert "padding_mask" in result_of(report, "cross_attention").note


def test_conversion_mistakes_outside_the_known_bugs_are_explained(grade_source):
    # Two mistakes in one convert_mask: hidden entries filled with the dtype's
    # lowest finite number, and no ValueError for a name it does not know.
    source = replace_function(SOLUTION, "convert_mask", '''
def convert_mask(mask, source, target, dtype=torch.float32):
    attend = mask if source == "attend" else ~mask if source == "block" else ~torch.isneginf(mask)
    if target == "attend":
        return attend
    if target == "block":
        return ~attend
    return torch.zeros(attend.shape, dtype=dtype, device=attend.device).masked_fill(
        ~attend, torch.finfo(dtype).min)
''')
    report = grade_source(source, chapter="ch02")
    result = result_of(report, "convert_mask")
    assert result.status == "failed"
    messages = _messages(result)
    assert re.search(r"has -3\.403e\+38 at \[[\d, ]+\] where the reference has -inf", messages)
    assert "blocked entries are not -inf" in messages
    assert "; expected a ValueError (a convention name it does not know)" in messages
    assert statuses(report)["cross_attention"] == "passed"


# -- the lesson ------------------------------------------------------------------------


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_the_lesson_figure_weights_are_those_the_text_quotes(masked):
    spec = importlib.util.spec_from_file_location("ch02_figures", LESSON / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    weights = module.cross_weights(masked)
    assert weights.sum(dim=-1).allclose(weights.new_ones(3))
    if masked:
        assert (weights[:, 3:] == 0).all()
    else:  # "each query gives 7 to 9 % of its attention to each <pad>"
        assert ((weights[:, 3:] >= 0.07) & (weights[:, 3:] < 0.095)).all()


# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py); a class's args
    are ``(init args, call args, call kwargs)``."""
    x, context = draw.randn(2, 3, 6), draw.randn(2, 5, 4)
    projections = (draw.weights(8, 6), draw.weights(8, 4), draw.weights(3, 4))
    additive = torch.zeros(2, 3, 4).masked_fill(~draw.mask(2, 3, 4), float("-inf"))
    return [
        ("padding_mask", (torch.tensor([3, 0, 5]),), {"max_len": 6}),
        ("padding_mask", (torch.tensor([3, 1, 4]),), {}),
        ("convert_mask", (draw.mask(2, 3, 4), "attend", "block"), {}),
        ("convert_mask", (draw.mask(2, 3, 4), "block", "additive"), {"dtype": torch.float64}),
        ("convert_mask", (additive, "additive", "attend"), {}),
        ("combine_masks", (draw.mask(2, 5),), {}),
        ("combine_masks", (draw.mask(2, 5), draw.mask(3, 5)), {}),
        ("combine_masks", (draw.mask(2, 5), draw.mask(2, 3, 5)), {}),
        ("cross_attention", (x, context, *projections), {}),
        ("cross_attention", (x, context, *projections), {"context_lengths": torch.tensor([5, 2])}),
        ("cross_attention", (x, context, *projections), {"context_lengths": torch.tensor([0, 3])}),
    ]


# The known bug tests/test_release.py makes in the edition and in this tree.
RELEASE_BUG = ("cross_attention", "padding-hides-queries")
