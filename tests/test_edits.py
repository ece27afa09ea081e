"""One-slip edits of the reference (``grader.edits``): every kind of slip is
made, an edit that explains nothing is never offered, and a grade names the
slip only where the exercise's checks agree on it."""

from __future__ import annotations

import ast
import json

import pytest
import torch

from grader import recorded, relations
from grader.catalog import find_chapter
from grader.chapters import KnownBug
from grader.edits import edits
from grader.grading import grade
from grader.known_bugs import Lookalikes, _reference_module, apply_bug, function_span
from grader.outcomes import Failure

# (chapter, exercise, a line of the reference, the line with one slip, the words the hint quotes)
SLIPS = [
    ("ch01", "softmax", "exps / exps.sum(dim=dim, keepdim=True)", "exps * exps.sum(dim=dim, keepdim=True)",
     "`exps * exps.sum(dim=dim, keepdim=True)` in place of `exps / exps.sum(dim=dim, keepdim=True)`"),  # operator
    ("ch01", "softmax", "torch.exp(x - shift)", "torch.exp(x)", "`torch.exp(x)` in place of"),  # operand out
    ("ch01", "softmax", "torch.exp(x - shift)", "torch.exp(shift - x)",
     "`torch.exp(shift - x)` in place of `torch.exp(x - shift)`"),  # operands exchanged
    ("ch01", "softmax", "exps.sum(dim=dim", "exps.mean(dim=dim",  # a function's twin
     "`exps.mean(dim=dim, keepdim=True)` in place of `exps.sum(dim=dim, keepdim=True)`, in what is returned"),
    ("ch01", "softmax", "exps.sum(dim=dim, keepdim=True)", "exps.sum(dim=dim)", "`exps.sum(dim=dim)`"),  # keyword out
    ("ch01", "scaled_dot_product_attention", "k.transpose(-2, -1)", "k.transpose(-3, -1)",
     "`k.transpose(-3, -1)` in place of `k.transpose(-2, -1)`"),  # a number
    ("ch01", "scaled_dot_product_attention", "q @ k.transpose(-2, -1) * scale", "q @ k * scale",
     "`q @ k` in place of"),  # a call left out
    ("ch01", "scaled_dot_product_attention", "masked_fill(~mask,", "masked_fill(mask,",
     "masked_fill(mask, float('-inf'))` in place of"),  # a ~ left out
    ("ch01", "scaled_dot_product_attention", 'float("-inf")', 'float("inf")', "'inf'"),
    ("ch01", "scaled_dot_product_attention", "keepdim=True)  # (..., L, 1)", "keepdim=False)  # (..., L, 1)",
     "keepdim=False"),  # True and False
    # A line left out is a ``pass`` in its place.
    ("ch01", "scaled_dot_product_attention", "weights = weights.masked_fill(no_keys, 0.0)", "pass",
     "the line `weights = weights.masked_fill(no_keys, 0.0)` left out"),
    ("ch01", "self_attention", "v = x @ w_v.T", "v = x @ w_k.T", "`x @ w_k.T` in place of `x @ w_v.T`"),  # roles
    ("ch02", "padding_mask", "positions < lengths.unsqueeze(-1)", "positions <= lengths.unsqueeze(-1)",
     "`positions <= lengths.unsqueeze(-1)` in place of `positions < lengths.unsqueeze(-1)`"),  # a comparison
    ("ch05", "apply_rope", "cos, sin = angles.cos()", "sin, cos = angles.cos()",
     "`(sin, cos)` in place of"),  # two names exchanged
    ("ch01", "self_attention", "scaled_dot_product_attention(q, k, v", "scaled_dot_product_attention(q, v, k",
     "`scaled_dot_product_attention(q, v, k, mask=mask)` in place of"),  # two arguments exchanged
]


def _definition(source: str, exercise: str) -> str:
    start, end = function_span(source, exercise)
    return ast.unparse(ast.parse(source[start:end]).body[0])


@pytest.mark.parametrize("chapter_id, exercise, old, new, quoted", SLIPS,
                         ids=[f"{slip[1]}:{slip[3][:30]}" for slip in SLIPS])
def test_every_kind_of_slip_is_an_edit_whose_hint_quotes_it(chapter_id, exercise, old, new, quoted):
    chapter = find_chapter(chapter_id)
    source = chapter.solution().read_text(encoding="utf-8")
    written = _definition(apply_bug(source, KnownBug(exercise, "slip", "", old, new)), exercise)
    made = {edit.source(): edit for edit in edits(chapter, exercise)}
    assert written in made, f"no edit writes {new!r}"
    assert quoted in made[written].hint, made[written].hint
    assert made[written].hint.name == relations.EDIT


def test_an_axis_swapped_with_itself_is_no_edit_of_its_own():
    """``k.transpose(-1, -1)`` is the transpose left out, which is an edit already."""
    sources = [edit.source() for edit in edits(find_chapter("ch01"), "scaled_dot_product_attention")]
    assert not any("transpose(-1, -1)" in source or "transpose(-2, -2)" in source for source in sources)
    assert any("q @ k * scale" in source for source in sources)


def test_no_edit_offered_raises_or_gives_the_right_answer():
    chapter = find_chapter("ch01")
    q, k, v = (torch.randn(2, 4, 8, dtype=torch.float64) for _ in range(3))
    lookalikes = Lookalikes(chapter, "scaled_dot_product_attention", (q, k, v), {})
    right = _reference_module(chapter).scaled_dot_product_attention(q, k, v)
    offered = [output for bug, output in lookalikes.outputs_by_bug() if getattr(bug, "name", None) == relations.EDIT]
    assert len(offered) > 10
    for output in offered:
        assert isinstance(output, tuple) and len(output) == 2
        assert not all(torch.equal(mine, theirs) for mine, theirs in zip(output, right))


def test_an_edit_is_judged_by_the_comparisons_that_tried_the_edits():
    slip = f"{relations.EDIT}:the slip"
    # A property of the answer (rows that sum to 1) holds a factor and has no edit to give:
    # it does not contradict the edit that the reference's comparisons agree on.
    assert slip in relations.held([{slip}, {slip}, {"factor"}], [True, True, False])
    # A comparison that tried the edits and holds another relation does.
    assert slip not in relations.held([{slip}, {slip}, {"factor"}], [True, True, True])


def test_more_than_two_with_edits_among_them_say_the_relations_alone():
    found = [relations.Found("scale", "the scores d times too large"),
             relations.Found(relations.EDIT, "one slip", "one slip"),
             relations.Found(relations.EDIT, "another slip", "another slip")]
    assert relations.said(found).name == "scale"
    assert relations.said(found[1:]).name == f"{relations.EDIT}+{relations.EDIT}"


def test_a_grade_names_the_slip_in_the_verdict(grade_source):
    chapter = find_chapter("ch01")
    mistake = KnownBug("softmax", "mean", "", "exps / exps.sum(dim=dim, keepdim=True)",
                       "exps / exps.mean(dim=dim, keepdim=True)")
    report = grade_source(apply_bug(chapter.solution().read_text(encoding="utf-8"), mistake),
                          chapter="ch01", only={"softmax"})
    (result,) = report.exercises
    assert result.reason.startswith("your code does what the reference does with one slip: "
                                    "`exps.mean(dim=dim, keepdim=True)` in place of "
                                    "`exps.sum(dim=dim, keepdim=True)`"), result.reason
    assert any(relations.EDIT in (check.relation or "").split("+") for check in result.failed_checks)


def test_a_slip_that_raises_is_named_by_the_edit_that_raises_the_same(grade_source):
    """The transpose left out: the scores' product raises on every input, as
    that edit of the reference does, with the same message."""
    chapter = find_chapter("ch01")
    slip = KnownBug("scaled_dot_product_attention", "slip", "", "q @ k.transpose(-2, -1) * scale", "q @ k * scale")
    report = grade_source(apply_bug(chapter.solution().read_text(encoding="utf-8"), slip),
                          chapter="ch01", only={"scaled_dot_product_attention"})
    (result,) = report.exercises
    assert result.reason.startswith("your code does what the reference does with one slip: `q @ k` in place of "
                                    "`q @ k.transpose(-2, -1)`"), result.reason
    assert all(check.kind == Failure.ERROR for check in result.failed_checks if check.relation)


def test_the_student_edition_names_a_slip_that_raises_as_the_instructors_tree_does(tmp_path):
    """What each edit raises is recorded with the known bugs' lookalikes of
    the same call (recording format 4) and replayed."""
    chapter, seed, only = find_chapter("ch01"), 5, {"scaled_dot_product_attention"}
    recorder = recorded.Recorder()
    grade([(chapter, chapter.solution())], seed=seed, only=only, mode=recorder)
    recorder.recordings["ch01"].save(tmp_path / "ch01.rec")
    (tmp_path / recorded.INDEX).write_text(json.dumps({"format": recorded.FORMAT, "seeds": [seed]}),
                                           encoding="utf-8")
    slip = KnownBug("scaled_dot_product_attention", "slip", "", "q @ k.transpose(-2, -1) * scale", "q @ k * scale")
    path = tmp_path / chapter.file_name
    path.write_text(apply_bug(chapter.solution().read_text(encoding="utf-8"), slip), encoding="utf-8")
    live = grade([(chapter, path)], seed=seed, only=only)
    replayed = grade([(chapter, path)], seed=seed, only=only, mode=recorded.Replayer(tmp_path))
    assert any(check.relation == relations.EDIT for check in live.exercises[0].checks)
    assert [(check.hint, check.relation) for check in replayed.exercises[0].checks] == \
        [(check.hint, check.relation) for check in live.exercises[0].checks]
