"""Failure messages say what differs, in the order a student should fix it."""

import json

import numpy as np
import pytest
import torch

from grader.catalog import find_chapter
from grader.check_runner import CheckResult
from grader.compare import CheckFailure, expect_close, unpack
from grader.grading import _verdict
from grader.outcomes import Failure, Status


def message_of(got, expected, **options) -> CheckFailure:
    with pytest.raises(CheckFailure) as caught:
        expect_close(got, expected, "f(x)", **options)
    return caught.value


def test_equal_values_pass():
    expect_close(torch.ones(2, 3), torch.ones(2, 3) + 1e-7, "f(x)")


@pytest.mark.parametrize("got, expected, text", [
    (None, torch.ones(2), "f(x) returned None: is a return statement missing?"),
    (np.ones(2), torch.ones(2), "f(x) returned a NumPy array, expected a torch.Tensor"),
    (torch.ones(2), np.ones(2), "f(x) returned a torch.Tensor, expected a NumPy array"),
    (torch.ones(2, 8, 4), torch.ones(2, 4, 8), "f(x) has shape (2, 8, 4), expected (2, 4, 8)"),
    (torch.ones(2, dtype=torch.float64), torch.ones(2), "has dtype torch.float64, expected torch.float32"),
    (np.ones(2, dtype=np.float32), np.ones(2), "has dtype float32, expected float64"),
])
def test_kind_shape_and_dtype_come_first(got, expected, text):
    assert text in message_of(got, expected).message


def test_nan_is_reported_with_its_position():
    got = torch.zeros(2, 3)
    got[1, 2] = float("nan")
    message = message_of(got, torch.zeros(2, 3)).message
    assert message == "f(x) has NaN at [1, 2] where the reference has 0 (1 of 6 entries differ)"


def test_the_worst_entry_is_named():
    expected = torch.zeros(2, 3)
    got = expected.clone()
    got[0, 1], got[1, 0] = 0.1, -0.31
    message = message_of(got, expected).message
    assert "max abs error 0.31 against the reference at [1, 0]" in message
    assert "(expected 0, got -0.31; 2 of 6 entries differ)" in message


@pytest.mark.parametrize("got, summary", [
    (torch.tensor([0.0, 0.1, -0.31]), "2 of 3 entries differ, by up to 0.31 at [2]"),
    (torch.tensor([0.0, float("nan"), 0.0]), "NaN at [1], expected 0; 1 of 3 entries differ"),
    (torch.zeros(3, 1), "shape (3, 1), expected (3,)"),
    (None, "returned None"),
])
def test_a_table_cell_gets_what_differed_in_a_few_words(got, summary):
    assert message_of(got, torch.zeros(3)).summary == summary


def test_a_failure_with_no_known_bug_says_in_the_table_what_differed():
    chapter = find_chapter("ch01")
    failed = CheckResult("ch01", "softmax", "matches the reference [3x5-dim0]", "failed",
                         "softmax(x (3, 5), dim=0): max abs error 0.87 ...", "mismatch",
                         summary="15 of 15 entries differ, by up to 0.873 at [2, 1]")
    result = _verdict(chapter, chapter.exercises[0], [failed], {})
    assert result.reason == ('fails "matches the reference [3x5-dim0]": 15 of 15 entries differ, '
                             'by up to 0.873 at [2, 1] (1 of 1 checks failed)')


def test_a_property_that_fails_is_summed_up_without_its_arguments():
    chapter = find_chapter("ch04")
    message = ("causal_mask(4, 6, device='cpu') lets a token see a later token (True above the "
               "diagonal): row 0 lets query 0 see keys 0 to 3, expected keys 0 to 2")
    failed = CheckResult("ch04", "causal_mask", "is causal", "failed", message, "mismatch")
    reason = _verdict(chapter, chapter.exercises[0], [failed], {}).reason
    assert reason == ('fails "is causal": causal_mask lets a token see a later token (True above the '
                      'diagonal): row 0 lets query 0 ... (1 of 1 checks failed)')


def test_a_matching_known_bug_gives_its_hint():
    expected = torch.ones(3)
    got = torch.full((3,), 2.0)

    def lookalikes():
        return iter([("looks like bug A", torch.zeros(3)), ("looks like bug B", torch.full((3,), 2.0))])

    assert message_of(got, expected, lookalikes=lookalikes).hint == "looks like bug B"
    assert message_of(got * 3, expected, lookalikes=lookalikes).hint is None


def test_tuples_are_unpacked_or_explained():
    assert unpack((1, 2), ("output", "weights"), "f(x)") == (1, 2)
    with pytest.raises(CheckFailure, match=r"expected a tuple \(output, weights\)"):
        unpack(torch.ones(2), ("output", "weights"), "f(x)")


def test_masks_and_integers_must_be_exactly_equal():
    expected = torch.tensor([[True, False], [True, True]])
    expect_close(expected.clone(), expected, "mask")
    got = expected.clone()
    got[1, 0] = False
    assert "at [1, 0]" in message_of(got, expected).message
    assert "at [2]" in message_of(torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3])).message


def test_a_finite_number_is_not_close_to_minus_infinity():
    expected = torch.tensor([0.0, float("-inf")])
    message = message_of(torch.tensor([0.0, -1e9]), expected).message
    assert message == "f(x) has -1e+09 at [1] where the reference has -inf (1 of 2 entries differ)"


def test_a_wrong_mask_entry_is_named_as_true_or_false():
    expected = torch.tensor([[True, False], [True, True]])
    got = torch.tensor([[True, True], [True, True]])
    message = message_of(got, expected).message
    assert message == "f(x) is True at [0, 1] where the reference has False (1 of 4 entries differ)"


def test_a_failure_kind_or_a_status_is_a_word_of_its_enum():
    failure = CheckFailure("softmax(x (3, 5)) raised ValueError", "error")
    assert failure.kind is Failure.ERROR and failure.kind == "error"
    assert json.dumps({"kind": failure.kind}) == '{"kind": "error"}' and f"{failure.kind}" == "error"
    with pytest.raises(ValueError):
        CheckFailure("a misspelt kind", "mismatched")  # would otherwise match no rule silently
    assert Status("not attempted").counts_as_passed and not Status.FAILED.counts_as_passed
