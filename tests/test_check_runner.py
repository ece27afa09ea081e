"""The checks are collected by pytest once per process and version of their
file, named as pytest names them, and called by the grader itself."""

from __future__ import annotations

import os
import sys
import types

import pytest

from grader import check_runner
from grader.check_runner import CollectionError, collected

CHECKS = '''
import pytest
from grader.checks import exercise, portability


@exercise("softmax")
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("shape", [pytest.param((2, 3), id="small"), (4,)])
def test_softmax_sums_to_one(submission, inputs, shape, dim, tolerance=1e-6):
    """sums to one along dim."""


@exercise("attention")
def test_attention_is_defined(submission):
    pass


@portability
@exercise("attention")
def test_attention_on_meta(submission, inputs):
    """would run on a GPU too."""
'''


def a_chapter(folder, text: str = CHECKS) -> types.SimpleNamespace:
    folder.mkdir(exist_ok=True)
    path = folder / "test_ch99_sample.py"
    path.write_text(text, encoding="utf-8")
    return types.SimpleNamespace(checks=path)  # all that collecting reads of a chapter


def test_checks_are_named_and_called_as_pytest_names_and_calls_them(tmp_path):
    checks = collected(a_chapter(tmp_path))
    assert [check.id for check in checks] == [
        "test_ch99_sample.py::test_softmax_sums_to_one[small-0]",
        "test_ch99_sample.py::test_softmax_sums_to_one[small--1]",
        "test_ch99_sample.py::test_softmax_sums_to_one[shape1-0]",
        "test_ch99_sample.py::test_softmax_sums_to_one[shape1--1]",
        "test_ch99_sample.py::test_attention_is_defined",
        "test_ch99_sample.py::test_attention_on_meta",
    ]
    first = checks[0]
    assert (first.exercise, first.title, first.parameters) == ("softmax", "sums to one along dim [small-0]",
                                                               {"shape": (2, 3), "dim": 0})
    # A parameter with a default is left to its default, as pytest leaves it.
    assert first.arguments == ("submission", "inputs", "shape", "dim")
    assert checks[4].title == "attention is defined"  # no docstring: the name says it
    assert [check.last for check in checks] == [False] * 5 + [True]


def test_a_file_is_collected_once_until_it_changes(tmp_path, monkeypatch):
    chapter = a_chapter(tmp_path)
    first = collected(chapter)
    sessions = []
    monkeypatch.setattr(pytest, "main", lambda *args, **kwargs: sessions.append(args) or 0)
    assert collected(chapter) is first and sessions == []
    monkeypatch.undo()

    text = CHECKS.replace("def test_attention_is_defined", "def test_attention_is_written")
    chapter.checks.write_text(text, encoding="utf-8")
    stat = chapter.checks.stat()
    os.utime(chapter.checks, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # however coarse the clock
    assert "test_ch99_sample.py::test_attention_is_written" in [check.id for check in collected(chapter)]


def test_a_file_that_failed_to_import_does_not_stand_in_for_the_next_of_its_name(tmp_path):
    """pytest names a check file's module after the file alone: neither a
    broken file nor another chapter's file of the same name is handed back."""
    with pytest.raises(CollectionError):
        collected(a_chapter(tmp_path / "broken", "import no_such_module\n"))
    assert len(collected(a_chapter(tmp_path / "whole"))) == 6
    assert not [name for name, module in sys.modules.items()
                if str(getattr(module, "__file__", "")).startswith(str(tmp_path))]


@pytest.mark.parametrize("text, expected", [
    (CHECKS + "\ndef test_broken(:\n", "SyntaxError"),
    (CHECKS + "\ndef test_unmarked(submission):\n    pass\n", "test_unmarked has no @exercise marker"),
], ids=["syntax error", "no exercise marker"])
def test_a_file_that_cannot_be_collected_is_the_courses_error_and_says_why(tmp_path, text, expected):
    with pytest.raises(CollectionError, match=expected):
        collected(a_chapter(tmp_path, text))


def test_collecting_leaves_the_callers_pytest_options_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_ADDOPTS", "--definitely-not-an-option")
    assert len(collected(a_chapter(tmp_path))) == 6
    assert os.environ["PYTEST_ADDOPTS"] == "--definitely-not-an-option"
    assert check_runner.PYTEST_ENVIRONMENT["PYTEST_ADDOPTS"] is None
