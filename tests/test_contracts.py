"""The contracts the docstrings state hold both ways: code that keeps them
gets full marks (``test_correct_styles``), code that breaks them fails the
check for that edge, with a message that says what the docstring asks."""

from __future__ import annotations

from conftest import SOLUTION, replace_function, result_of, solution_source, statuses
from grader.catalog import find_chapter

CH01_OTHERS = {"scaled_dot_product_attention": "passed", "self_attention": "passed",
               "softmax_numpy": "passed", "scaled_dot_product_attention_numpy": "passed"}


def failed_checks(report, exercise: str) -> dict[str, str]:
    return {check.check: check.message for check in result_of(report, exercise).failed_checks}


def test_a_softmax_that_gives_zeros_for_a_slice_of_minus_infinity_fails(grade_source):
    source = replace_function(SOLUTION, "softmax", '''
def softmax(x, dim=-1):
    # "safe": a slice with no finite entry gets zeros instead of NaN
    top = x.amax(dim=dim, keepdim=True).clamp(min=torch.finfo(x.dtype).min)
    e = (x - top).exp()
    return e / e.sum(dim=dim, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny)
''')
    report = grade_source(source)
    assert statuses(report) == {"softmax": "failed", **CH01_OTHERS}
    failed = failed_checks(report, "softmax")
    assert set(failed) == {"gives NaN along a slice that is all -inf [row]",
                           "gives NaN along a slice that is all -inf [column]"}
    assert all("gives 0 there; the docstring asks for NaN" in message for message in failed.values())
    assert result_of(report, "softmax").reason.startswith(
        'fails "gives NaN along a slice that is all -inf [row]": 0 where the slice is all -inf, expected NaN')


def test_a_softmax_computed_in_float16_is_not_float32_accurate(grade_source):
    source = replace_function(SOLUTION, "softmax", '''
def softmax(x, dim=-1):
    # the precision rule allows float32 or wider inside, not narrower
    half = x.half()
    e = (half - half.amax(dim=dim, keepdim=True)).exp()
    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)
''')
    report = grade_source(source)
    assert result_of(report, "softmax").status == "failed"
    assert any("max abs error" in message for message in failed_checks(report, "softmax").values())


def test_a_padding_mask_that_needs_a_sequence_fails_only_the_empty_batch(grade_source):
    chapter = find_chapter("ch02")
    source = replace_function(solution_source(chapter), "padding_mask", '''
def padding_mask(lengths, max_len=None):
    size = int(lengths.max()) if max_len is None else max_len
    positions = torch.arange(size, device=lengths.device)
    return torch.stack([positions < length for length in lengths])
''')
    report = grade_source(source, chapter="ch02")
    failed = failed_checks(report, "padding_mask")
    assert list(failed) == ["gives shape (0, S) for a batch of no sequences"]
    (message,) = failed.values()
    assert message.startswith("padding_mask(lengths (0,) int64, max_len=4) raised RuntimeError at line")
