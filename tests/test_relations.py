"""A wrong answer that no known bug explains is named by its relation to the right one.

Each relation of ``grader.relations`` is shown to hold for the mistake it
names, and to stay silent on what only looks like it: an answer a rounding
away from the right one, an answer wrong in some other way, two relations
at once that cannot be told apart. Then the path through a grade: a check's
failure carries the relation's hint, a known bug's hint keeps its priority
over it, and the exercise's verdict names it.
"""

import math
import sys
import types

import numpy as np
import pytest
import torch

from grader import relations
from grader.catalog import find_chapter
from grader.check_runner import ChapterRun, CheckResult
from grader.compare import CheckFailure, expect_close
from grader.grading import _verdict
from grader.outcomes import Failure, Status
from grader.relations import explain

WEIGHT_AXES = ("queries", "keys")


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _scores(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=_generator(seed), dtype=torch.float64)


def _causal(rows: int, columns: int) -> torch.Tensor:
    return torch.ones(rows, columns, dtype=torch.bool).tril(columns - rows)


def named(got, expected, axes=()) -> str | None:
    found = explain(got, expected, axes)
    return found.name if found else None


# -- each relation, on the mistake it names ------------------------------------------------


def _cases():
    scores = _scores(2, 5, 6)
    weights = scores.softmax(-1)
    x = _scores(2, 7, 4, seed=1)
    later = torch.cat([torch.zeros(2, 1, 4, dtype=x.dtype), x[:, :-1]], 1)
    last_wrong = x.clone()
    last_wrong[:, -1] += 1
    causal = _causal(5, 6)
    masked_scores = scores.masked_fill(~causal, float("-inf"))
    no_key = masked_scores.softmax(-1)
    no_key[:, 2] = 0.0
    nan_rows = no_key.clone()
    nan_rows[:, 2] = float("nan")
    return [
        ("softmax over the queries", scores.softmax(-2), weights, "normalized_over"),
        ("scale missing", (scores * math.sqrt(8)).softmax(-1), weights, "scale"),
        ("scale applied twice", (scores / math.sqrt(8)).softmax(-1), weights, "scale"),
        ("weights transposed", weights.transpose(-1, -2), weights, "transposed"),
        ("log_softmax", scores.log_softmax(-1), weights, "log"),
        ("a sum where a mean belongs", 7 * x, x, "factor"),
        ("sign flipped", -x, x, "factor"),
        ("a count twice too large", 2 * 1234, 1234, "factor"),
        ("a reshape where a transpose belongs", scores.reshape(2, 6, 5).transpose(1, 2), scores, "rearranged"),
        ("positions one later", later, x, "shifted"),
        ("the last position treated apart", last_wrong, x, "edge"),
        ("a mask's True and False swapped", ~causal, causal, "inverted"),
        ("a causal mask without its diagonal", _causal(5, 5).tril(-1), _causal(5, 5), ("diagonal", "shifted")),
        ("the causal mask not applied to the weights", scores.softmax(-1), masked_scores.softmax(-1), "masked"),
        ("the causal mask not applied to the scores", scores, masked_scores, ("future", "masked")),
        ("computed in float16", x.half().double(), x, "narrowed"),
        ("rounded to float16 inside", x * (1 + 3e-4 * _scores(2, 7, 4, seed=2)), x, "narrowed"),
        ("computed in bfloat16", x.bfloat16().double(), x, "narrowed"),
        ("NaN for a query with no key", nan_rows, no_key, "nan_rows"),
    ]


@pytest.mark.parametrize("what, got, expected, relation", _cases(), ids=[case[0] for case in _cases()])
def test_a_relation_names_its_mistake(what, got, expected, relation):
    found = explain(got, expected, WEIGHT_AXES)
    assert found is not None, what
    names = set(found.name.split("+"))
    assert names == set(relation if isinstance(relation, tuple) else (relation,)), (what, found)


def test_the_hint_says_which_axes_in_the_students_words():
    scores = _scores(2, 5, 6)
    hint = explain(scores.softmax(-2), scores.softmax(-1), WEIGHT_AXES).hint
    assert "sum to 1 over the queries (dim -2), not over the keys (dim -1)" in hint
    hint = explain((scores * math.sqrt(8)).softmax(-1), scores.softmax(-1), WEIGHT_AXES).hint
    assert "times 2.828 (sqrt(8))" in hint and "missing" in hint


def test_numpy_arrays_are_examined_as_tensors():
    scores = _scores(3, 4).numpy()
    assert named(np.exp(scores) / np.exp(scores).sum(0, keepdims=True),
                 np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)) == "normalized_over"


# -- silence where the answer does not say --------------------------------------------------


def test_an_answer_wrong_in_another_way_gets_no_relation():
    scores = _scores(2, 5, 6)
    for seed in range(20):
        assert named(_scores(2, 5, 6, seed=seed + 1), scores) is None
        assert named(_scores(2, 5, 6, seed=seed + 1).softmax(-1), scores.softmax(-1), WEIGHT_AXES) is None


def test_an_answer_a_rounding_away_is_named_for_its_precision_alone():
    """Close, but just past the tolerance, with errors of either sign: the
    precision relation, and none of those with a fitted constant (whose
    looser tolerance must not make a factor or a temperature out of it)."""
    scores = _scores(4, 6)
    weights = scores.softmax(-1)
    nudged = weights * (1 + 5e-4 * _scores(4, 6, seed=1))  # rounding errors, all over
    nudged = nudged / nudged.sum(-1, keepdim=True)
    assert not torch.allclose(nudged, weights, rtol=1e-4, atol=1e-5)
    assert named(nudged, weights, WEIGHT_AXES) == "narrowed"
    assert named(scores * (1 + 3e-4), scores) is None  # one sign, one size: a formula, not rounding


def test_uniform_weights_say_nothing_of_a_temperature():
    uniform = torch.full((3, 4), 0.25, dtype=torch.float64)
    peaked = torch.tensor([[0.7, 0.1, 0.1, 0.1]] * 3, dtype=torch.float64)
    assert named(peaked, uniform) != "scale"


def test_nan_in_rows_that_have_keys_is_not_blamed_on_a_mask():
    """Rows of NaN where the expected row is not 0 come from something else
    (an overflow): no mask hint."""
    weights = _scores(3, 4).softmax(-1)
    got = weights.clone()
    got[1] = float("nan")
    assert named(got, weights) is None


def test_more_than_two_relations_name_none():
    """A 2 x 2 answer of zeros and ones fits too many transforms to tell."""
    expected = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert named(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), expected) is None


def test_a_value_of_no_array_kind_gets_no_relation():
    assert named("a string", torch.ones(3)) is None
    assert named(None, torch.ones(3)) is None
    assert named(torch.ones(3, dtype=torch.complex64), torch.ones(3, dtype=torch.complex64)) is None


# -- through a grade ------------------------------------------------------------------------


def test_a_failed_comparison_carries_what_it_compared_unless_a_known_bug_matched():
    scores = _scores(2, 5, 6, seed=3).float()
    with pytest.raises(CheckFailure) as caught:
        expect_close(scores.softmax(-2), scores.softmax(-1), "f(x)", axes=WEIGHT_AXES)
    assert caught.value.compared is not None and caught.value.compared.axes == WEIGHT_AXES
    with pytest.raises(CheckFailure) as caught:
        expect_close(scores.softmax(-2), scores.softmax(-1), "f(x)",
                     lookalikes=lambda: iter([("looks like a known bug", scores.softmax(-2))]))
    assert caught.value.hint == "looks like a known bug" and caught.value.compared is None


def _result(exercise: str, hint=None, relation=None, outcome="failed") -> CheckResult:
    return CheckResult("ch01", exercise, f"check of {exercise}", outcome, "differs", Failure.MISMATCH,
                       hint=hint, relation=relation, summary="1 of 4 entries differ")


def test_a_known_bugs_hint_keeps_its_priority_over_a_relation():
    chapter = find_chapter("ch01")
    run = ChapterRun.__new__(ChapterRun)
    run._examined = []
    run.results = [_result("softmax", "your values sum to 1 over dim -2", "normalized_over"),
                   _result("softmax", "looks like the softmax runs over the queries"),
                   _result("scaled_dot_product_attention", "your weights are a softmax", "scale")]
    run._settle_hints()
    assert [(result.hint, result.relation) for result in run.results] == [
        (None, None), ("looks like the softmax runs over the queries", None),
        ("your weights are a softmax", "scale")]
    exercise = chapter.exercise("softmax")
    verdict = _verdict(chapter, exercise, run.results[:2], {})
    assert verdict.status == Status.FAILED and "check of softmax" in verdict.reason  # as before relations


def test_the_verdict_names_a_relation_of_any_failed_check():
    chapter = find_chapter("ch01")
    exercise = chapter.exercise("softmax")
    checks = [_result("softmax"), _result("softmax", "your values sum to 1 over dim -2", "normalized_over")]
    verdict = _verdict(chapter, exercise, checks, {})
    assert verdict.reason.startswith("your values sum to 1 over dim -2")


def test_a_chapter_adds_its_own_relations(monkeypatch):
    """``grader/chapters/chNN/relations.py``'s ``RELATIONS`` are tried after the shared ones."""

    def halved_heads(mismatch):  # what a chapter might know of its answers' layout
        return relations.Found("halved", "your heads are halved") if mismatch.got.shape[-1] * 2 == \
            mismatch.expected.shape[-1] else None

    module = types.ModuleType("grader.chapters.ch01.relations")
    module.RELATIONS = (halved_heads,)
    monkeypatch.setitem(sys.modules, "grader.chapters.ch01.relations", module)
    relations.chapter_relations.cache_clear()
    try:
        expected = _scores(2, 8)
        assert named(expected[:, :4], expected) is None
        found = explain(expected[:, :4], expected, chapter="ch01")
        assert found is not None and found.name == "halved"
    finally:
        relations.chapter_relations.cache_clear()
