"""What a student reads in the grade table: every problem said once, in a
row that stays readable at 80 columns, their own prints on request, and a
line for every timeout."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from conftest import CH01, FAST, SOLUTION, replace_function, result_of, statuses
from grader.check_runner import CheckResult
from grader.grading import ExerciseResult, GradeReport, grade
from grader.outcomes import Failure, Status
from grader.report import print_table

WIDTHS = (80, 100, 140)


def shown(report: GradeReport, width: int = 80, verbose: bool = False) -> str:
    """The table as a terminal ``width`` columns wide shows it, as plain text."""
    console = Console(record=True, width=width, color_system=None, force_terminal=False)
    print_table(report, console, verbose)
    return console.export_text()


def graded_file(tmp_path, data: bytes, name: str = CH01.file_name, only: set[str] | None = None) -> GradeReport:
    """The grade of a chapter 1 file holding exactly ``data``."""
    path = tmp_path / name
    path.write_bytes(data)
    return grade([(CH01, path)], limits=FAST, seed=1234, only=only)


# -- 7: the student's own prints ---------------------------------------------------------

PRINTING = replace_function(SOLUTION, "softmax", '''
def softmax(x, dim=-1):
    print("[bold red]inside softmax[/bold red]", x.shape)
    shift = x.amax(dim=dim, keepdim=True).detach()
    exps = torch.exp(x - shift)
    return exps / exps.sum(dim=dim, keepdim=True)
''') + '\nprint("hello from the top \\x1b[31mred\\x1b[0m [link=http://x]here[/link]")\n'


def test_prints_are_hidden_with_one_line_that_says_so(grade_source):
    report = grade_source(PRINTING, only={"softmax"})
    assert report.passed  # a print changes no verdict
    text = shown(report)
    assert "inside softmax" not in text and "hello from the top" not in text
    [line] = [line for line in text.splitlines() if "printed" in line]
    assert "-v" in line


def test_prints_are_shown_with_verbose_as_the_students_own_text(grade_source):
    report = grade_source(PRINTING, only={"softmax"})
    text = shown(report, verbose=True)
    # As text, never as markup or a terminal's escape sequence.
    assert "[bold red]inside softmax[/bold red] torch.Size([" in text
    assert "hello from the top \\x1b[31mred\\x1b[0m [link=http://x]here[/link]" in text
    assert "\x1b" not in text
    # Labelled as the student's: the file's top level, and the exercise whose calls printed.
    lines = text.splitlines()
    top = next(index for index, line in enumerate(lines) if "hello from the top" in line)
    assert "top level" in lines[top - 1] and "printed" in lines[top - 1]
    inside = next(index for index, line in enumerate(lines) if "inside softmax" in line)
    assert "softmax" in lines[inside - 1] and "printed" in lines[inside - 1]


def test_a_print_flood_shows_a_bounded_part_and_says_how_much_more(grade_source):
    source = replace_function(SOLUTION, "softmax_numpy", '''
def softmax_numpy(x, axis=-1):
    for _ in range(2000):
        print("x" * 1000)
    shift = np.max(x, axis=axis, keepdims=True)
    exps = np.exp(x - shift)
    return exps / np.sum(exps, axis=axis, keepdims=True)
''')
    report = grade_source(source, only={"softmax_numpy"})
    assert report.passed
    text = shown(report, width=100, verbose=True)
    assert text.count("x") < 10_000
    assert re.search(r"[\d,]+ more characters", text)


# -- 9: a problem of the whole file, said once --------------------------------------------

NOT_JSON = b'{"cells": [ {"cell_type": "code", "source": "def softmax('


@pytest.mark.parametrize("name, data, reason", [
    (CH01.file_name, b"", "empty"),
    (CH01.file_name, b"\x7fELF\x02\x01\x01\x00\xff\xfe\x00\x00", "not UTF-8 text"),
    (CH01.file_name, b"x = 1\0\n", "null bytes"),
    (CH01.file_name.replace(".py", ".ipynb"), NOT_JSON, "not valid notebook JSON"),
], ids=["empty", "binary", "null-bytes", "notebook-not-json"])
def test_a_problem_of_the_whole_file_is_said_once(tmp_path, name, data, reason):
    report = graded_file(tmp_path, data, name)
    assert report.score == 0
    for width in WIDTHS:
        text = shown(report, width)
        assert text.count(reason) == 1, text
        assert len(text.splitlines()) <= len(CH01.exercises) + 10, text


def test_a_syntax_error_is_said_once(grade_source):
    source = SOLUTION.replace("    return exps / exps.sum(dim=dim, keepdim=True)\n",
                              "    return exps / exps.sum(dim=dim, keepdim=True\n", 1)
    report = grade_source(source, only={"softmax", "scaled_dot_product_attention"})
    assert statuses(report)["softmax"] == "failed"
    for width in WIDTHS:
        assert shown(report, width).count("was never closed") == 1
    # Its caller fails on it, says so, and adds no note that the call could
    # not run on the meta device, which is the same error again.
    caller = result_of(report, "scaled_dot_product_attention")
    assert caller.status == "failed" and "it uses softmax, which fails too" in caller.note
    assert "meta device" not in caller.note and "syntax error" not in caller.note


# -- 10: timeouts -------------------------------------------------------------------------

LOOPING_SOFTMAX = replace_function(SOLUTION, "softmax", '''
def softmax(x, dim=-1):
    while True:
        pass
''')


def test_a_caller_of_a_looping_exercise_is_told_it_uses_it(grade_source):
    report = grade_source(LOOPING_SOFTMAX, only={"softmax", "scaled_dot_product_attention"})
    caller = result_of(report, "scaled_dot_product_attention")
    assert caller.status == "failed" and caller.failed_checks[0].kind == Failure.TIMEOUT
    assert caller.note == "it uses softmax, which fails too"


def test_a_timeout_has_a_line_even_after_another_failure(grade_source):
    # Wrong (a known bug, whose hint sums the row up) in float32, a loop in float64.
    source = replace_function(SOLUTION, "softmax", '''
def softmax(x, dim=-1):
    while x.dtype == torch.float64:
        pass
    exps = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return exps / exps.sum()
''')
    report = grade_source(source, only={"softmax"})
    result = result_of(report, "softmax")
    assert result.failed_checks[0].kind == Failure.MISMATCH
    assert any(check.kind == Failure.TIMEOUT for check in result.failed_checks)
    line = source.splitlines().index("    while x.dtype == torch.float64:") + 1
    for width in WIDTHS:
        text = " ".join(shown(report, width).split())
        timeout = re.search(r"softmax\(.*?\) used 2 s of CPU time without finishing, at line (\d+)", text)
        assert timeout is not None and int(timeout[1]) == line, text


# -- 12: the table at 80 columns ----------------------------------------------------------

HINT = ("looks like the scores are not multiplied by 1/sqrt(d_k): the scores grow with d_k, and the "
        "softmax saturates, giving nearly all the weight to one key")


def _long_report() -> GradeReport:
    """Every exercise of chapter 1 failed with a long hint, but one passed."""
    results = []
    for exercise in CH01.exercises:
        check = CheckResult("ch01", exercise.name, "matches the reference [L4-S4-d8]", "failed",
                            f"{exercise.name}(q (4, 8), k (4, 8), v (4, 8)): output differs",
                            Failure.MISMATCH, hint=HINT)
        results.append(ExerciseResult(CH01, exercise, Status.FAILED, f"{HINT} (1 of 9 checks failed)", [check]))
    results[-1] = ExerciseResult(CH01, CH01.exercises[-1], Status.PASSED, "7 checks passed", [])
    return GradeReport(results, seconds=1.0, seed=1)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_table_keeps_names_whole_and_hints_readable(width):
    text = shown(_long_report(), width)
    lines = text.splitlines()
    assert max(map(len, lines)) <= width
    for exercise in CH01.exercises:
        assert re.search(rf"^ ?{exercise.name} +(✓ pass|✗ fail) +\d+ / {exercise.points}\b", text, re.MULTILINE), text
    # The hint reads as a paragraph under its row, each line nearly as wide as the terminal.
    row = next(index for index, line in enumerate(lines) if line.lstrip().startswith("softmax "))
    following = next(index for index, line in enumerate(lines)
                     if line.lstrip().startswith("scaled_dot_product_attention "))
    details = [line for line in lines[row + 1:following] if line.strip()]
    assert " ".join(details).split() == f"{HINT} (1 of 9 checks failed)".split(), text
    assert len(details) <= len(HINT) // (width - 12) + 1, text


def test_an_exception_message_shows_as_text_not_as_terminal_commands(grade_source):
    source = replace_function(SOLUTION, "softmax", '''
def softmax(x, dim=-1):
    raise ValueError("\\x1b[2J\\x1b[H[bold]all checks passed[/bold]")
''')
    report = grade_source(source, only={"softmax"})
    for verbose in (False, True):
        text = shown(report, verbose=verbose)
        assert "\x1b" not in text
        assert "\\x1b[2J\\x1b[H[bold]all checks passed[/bold]" in " ".join(text.split())


def test_a_hint_is_said_once_in_the_row_not_again_under_its_check(grade_source):
    report = grade_source(SOLUTION.replace("scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0"),
                          only={"scaled_dot_product_attention"})
    (result,) = [result for result in report.exercises if result.status == Status.FAILED]
    hint = result.failed_checks[0].hint
    assert hint and result.reason.startswith(hint)
    for width in WIDTHS:
        text = " ".join(shown(report, width).split())  # as one line, wherever it wrapped
        assert text.count(hint) == 1, text
        assert "max abs error" in text  # what the first failed check found, below the table
