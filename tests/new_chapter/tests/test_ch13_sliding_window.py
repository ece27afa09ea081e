"""Chapter 13's own tests: the lesson's claims about the window's two
extremes, on the reference."""

import importlib.util

import torch

from conftest import Draw
from grader.catalog import find_chapter

CH13 = find_chapter("ch13")


def _reference():
    spec = importlib.util.spec_from_file_location("reference_ch13", CH13.solution())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_window_as_wide_as_the_sequence_is_the_causal_mask_and_a_window_of_one_the_diagonal():
    mask = _reference().sliding_window_mask
    assert torch.equal(mask(torch.arange(5), 5), torch.ones(5, 5, dtype=torch.bool).tril())
    assert torch.equal(mask(torch.arange(5), 1), torch.eye(5, dtype=torch.bool))


# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py)."""
    gaps = torch.cumsum(1 + draw.positions(7, below=3), dim=0)  # (T,) = (7,), increasing
    return [
        ("sliding_window_mask", (torch.arange(6), 3), {}),
        ("sliding_window_mask", (torch.arange(4), 10), {}),
        ("sliding_window_mask", (gaps, 2), {}),
    ]


# The known bug tests/test_release.py makes in the edition and in this tree.
RELEASE_BUG = ("sliding_window_mask", "sees-the-future")
