"""Show a ``GradeReport``: a rich table for people, JSON for Gradescope;
and what ``verify`` found.

The JSON follows Gradescope's ``results.json`` schema (top-level ``score``,
``max_score``, ``execution_time``, ``output`` and ``tests``, one test per
exercise), so the same output serves a student's terminal, a script and an
autograder upload.
"""

from __future__ import annotations

import json

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from grader.catalog import COURSE_ROOT, gradescope_test_name
from grader.grading import GradeReport
from grader.outcomes import Status
from grader.verify import ExerciseAudit, Verification

STATUS_STYLE = {
    Status.PASSED: ("✓ pass", "green"),
    Status.FAILED: ("✗ fail", "red"),
    Status.NOT_IMPLEMENTED: ("· todo", "yellow"),
    Status.MISSING: ("✗ missing", "red"),
    Status.NOT_ATTEMPTED: ("· optional", "dim"),
}


def _notes(report: GradeReport) -> list[str]:
    return [f"{chapter}: {note}" for chapter, notes in report.notes.items() for note in notes]


def print_table(report: GradeReport, console: Console, verbose: bool = False) -> None:
    """A table per chapter, one row per exercise (status, points, reason and
    note), then the total; with ``verbose``, every failed check below it."""
    for note in _notes(report):
        console.print(Text(f"note: {note}", style="yellow"))
    chapters = list(dict.fromkeys(result.chapter for result in report.exercises))
    for chapter in chapters:
        # No vertical rules: a narrow terminal's width goes to the details.
        table = Table(title=f"{chapter.id} · {chapter.title}", title_justify="left",
                      title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("exercise", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("points", justify="right", no_wrap=True)
        table.add_column("details", min_width=20, ratio=1)
        for result in report.exercises:
            if result.chapter is chapter:
                label, style = STATUS_STYLE[result.status]
                # Text, not markup: a reason may quote the student's own "[...]".
                details = Text(result.reason)
                if result.note:  # whatever the status: a note (the static scan's, say) costs no point
                    details.append(f"\nnote: {result.note}", style="yellow")
                table.add_row(result.exercise.name, Text(label, style=style),
                              f"{result.score} / {result.exercise.points}", details)
        console.print(table)
        if chapter.id in report.sources:
            console.print(Text(f"graded: {report.sources[chapter.id]}", style="dim"))
    _print_failures(report, console, verbose)
    style = "bold green" if report.passed else "bold"
    console.print(Text(f"Total: {report.score} / {report.max_score} points", style=style),
                  Text(f"  ({report.seconds:.1f} s, seed {report.seed}, {report.device})", style="dim"))


def _print_failures(report: GradeReport, console: Console, verbose: bool) -> None:
    """Why each failed exercise failed: its first failed check in full (every
    one with ``verbose``), the hint when the value matches a known bug."""
    for result in report.exercises:
        if result.status != Status.FAILED:
            continue
        console.print(Text(f"{result.chapter.id} {result.exercise.name}", style="bold red"))
        for check in result.failed_checks if verbose else result.failed_checks[:1]:
            console.print(_indented(check.check, 2, "bold"))
            console.print(_indented(check.message, 4))
            if check.hint:
                console.print(_indented(f"hint: {check.hint}", 4, "cyan"))
            if verbose and check.details:
                console.print(Text(check.details, style="dim"))


def _indented(text: str, spaces: int, style: str = "") -> Padding:
    """``text`` indented, its wrapped lines too (a narrow terminal wraps
    most messages)."""
    return Padding(Text(text, style=style), (0, 0, 0, spaces))


def results_json(report: GradeReport) -> dict:
    """The report in Gradescope's ``results.json`` schema."""
    tests = []
    for result in report.exercises:
        lines = [result.reason]
        for check in result.failed_checks:
            lines.append(f"- {check.check}: {check.message}")
            if check.hint:
                lines.append(f"  hint: {check.hint}")
        if result.note:
            lines.append(f"note: {result.note}")
        tests.append({
            "name": gradescope_test_name(result.chapter, result.exercise),
            "score": result.score,
            "max_score": result.exercise.points,
            # An optional exercise left alone failed nothing (and is worth 0 of 0).
            "status": "passed" if result.status.counts_as_passed else "failed",
            "output": "\n".join(lines),
            "visibility": "visible",
        })
    return {
        "score": report.score,
        "max_score": report.max_score,
        "execution_time": round(report.seconds, 3),
        "output": "\n".join([f"{chapter}: graded {source}" for chapter, source in report.sources.items()]
                           + _notes(report)),
        "tests": tests,
    }


def print_json(report: GradeReport) -> None:
    print(json.dumps(results_json(report), indent=2))


def print_verification(result: Verification, console: Console, matrix: bool = False) -> None:
    """``mha-course verify``'s table: per exercise its checks, the reference
    and the stub against them (✓: passes all, fails all), its known bugs
    caught, and how many checks catch each (fewest–most); with ``matrix``,
    checks x bugs for each exercise. Then every gap, one line each."""
    # Fits 80 columns (a pipe, a CI log): exercises under a row for their chapter.
    table = Table(title="mha-course verify", title_justify="left", title_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("exercise", no_wrap=True)
    for name in ("checks", "reference", "stub", "bugs", "per bug"):  # per bug: checks that catch one
        table.add_column(name, justify="left" if name in ("reference", "stub") else "right",
                         no_wrap=True, min_width=len(name))
    chapter = None
    for audit in result.exercises:
        if audit.chapter is not chapter:
            chapter = audit.chapter
            table.add_row(Text(chapter.id, style="bold"))
        caught = len(audit.catches) - len(audit.missed_bugs)
        counts = [len(checks) for checks in audit.catches.values()]
        table.add_row(
            audit.exercise.name,
            str(len(audit.checks)),
            _ok(not audit.reference_failures, f"{len(audit.reference_failures)} fail"),
            _ok(not audit.stub_passes, f"{len(audit.stub_passes)} pass"),
            Text(f"{caught}/{len(audit.catches)}", style="red" if audit.gaps else "green"),
            f"{min(counts)}–{max(counts)}" if counts else "–",
        )
    console.print(table)
    if matrix:
        for audit in result.exercises:
            _print_matrix(audit, console)
    for audit in result.exercises:
        for gap in audit.gaps:
            console.print(Text(f"✗ {audit.chapter.id} {audit.exercise.name}: {gap}", style="red"))
    for path in result.stale:
        if path not in result.edited:
            shown = path.relative_to(COURSE_ROOT) if path.is_relative_to(COURSE_ROOT) else path
            console.print(Text(f"✗ out of date (run mha-course build): {shown}", style="red"))
    if result.edited:
        names = ", ".join(path.name for path in result.edited)
        console.print(Text(f"note: exercises/ holds work in {names}; the stubs were graded as the "
                           "build writes them, and mha-course build leaves those files alone",
                           style="yellow"))
    checks = sum(len(audit.checks) for audit in result.exercises)
    bugs = sum(len(audit.catches) for audit in result.exercises)
    verdict = ("verified", "bold green") if result.passed else ("gaps found", "bold red")
    console.print(Text.assemble(verdict, f": {len(result.exercises)} exercises, {checks} checks, "
                                         f"{bugs} known bugs"))


def _ok(good: bool, bad: str) -> Text:
    return Text("✓", style="green") if good else Text(f"✗ {bad}", style="red")


def _print_matrix(audit: ExerciseAudit, console: Console) -> None:
    """Checks as rows, the exercise's known bugs as numbered columns: ● where
    the check fails with the bug in, so a bug only one check catches shows."""
    bugs = list(audit.catches)
    console.print(Text(f"\n{audit.chapter.id} {audit.exercise.name}", style="bold"))
    for number, bug in enumerate(bugs, start=1):
        console.print(Text(f"  {number:>2}  {bug}", style="dim"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("check", overflow="ellipsis", no_wrap=True, max_width=44)
    for number in range(1, len(bugs) + 1):
        table.add_column(str(number), justify="center", no_wrap=True)
    for check in audit.checks:
        table.add_row(Text(check), *("●" if check in audit.catches[bug] else "·" for bug in bugs))
    table.add_row(Text("checks catching it", style="bold"),
                  *(Text(str(len(audit.catches[bug])), style="bold" if audit.catches[bug] else "bold red")
                    for bug in bugs))
    console.print(table)
