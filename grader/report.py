"""Show a ``GradeReport``: a rich table for people, JSON for Gradescope;
and what ``verify`` found.

The JSON follows Gradescope's ``results.json`` schema (top-level ``score``,
``max_score``, ``execution_time``, ``output`` and ``tests``, one test per
exercise), so the same output serves a student's terminal, a script and an
autograder upload.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from grader.catalog import COURSE_ROOT, Chapter, gradescope_test_name
from grader.check_runner import CheckResult
from grader.grading import ExerciseResult, GradeReport
from grader.outcomes import Failure, Status
from grader.remote_submission import TOP_LEVEL

if TYPE_CHECKING:  # verify's table only: a grade, which prints a report, never imports verify (nor build)
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
    note), then why each failed exercise failed, what the student's code
    printed, and the total; with ``verbose``, every failed check and the
    printed text itself."""
    for note in _notes(report):
        console.print(Text(f"note: {note}", style="yellow"))
    chapters = list(dict.fromkeys(result.chapter for result in report.exercises))
    for chapter in chapters:
        _print_chapter(report, chapter, console)
    _print_failures(report, console, verbose)
    _print_printed(report, console, verbose)
    style = "bold green" if report.passed else "bold"
    console.print(Text(f"Total: {report.score} / {report.max_score} points", style=style),
                  Text(f"  ({report.seconds:.1f} s, seed {report.seed}, {report.device})", style="dim"))


_GAP = "   "  # between the table's columns


def _print_chapter(report: GradeReport, chapter: Chapter, console: Console) -> None:
    """The chapter's table: exercise, status and points in columns, each
    row's details beside them where they fit on its line, else under it at
    the terminal's full width (a narrow column would cut the names and wrap
    a hint over ten lines). A problem of the whole file is said once, under
    the title, instead of in every row."""
    results = [result for result in report.exercises if result.chapter is chapter]
    problem = report.problems.get(chapter.id)
    console.print(Text(f"{chapter.id} · {chapter.title}", style="bold"))
    if problem:
        console.print(Text(problem, style="red"))
    widths = (max(len("exercise"), *(len(result.exercise.name) for result in results)),
              max(len("status"), *(len(STATUS_STYLE[result.status][0]) for result in results)),
              max(len("points"), *(len(_points(result)) for result in results)))
    console.print(Text(" " + _GAP.join(("exercise".ljust(widths[0]), "status".ljust(widths[1]),
                                        "points".rjust(widths[2]), "details")), style="bold"))
    console.print(Text(" " + "─" * (console.width - 2)))
    for result in results:
        row = _row(result, widths)
        details = Text() if problem else _details(result)
        if "\n" not in details.plain and row.cell_len + len(_GAP) + details.cell_len <= console.width:
            console.print(Text.assemble(row, _GAP if details else "", details))
        else:
            console.print(row)
            console.print(Padding(details, (0, 0, 0, 4)))
    console.print()
    if chapter.id in report.sources:
        console.print(Text(f"graded: {report.sources[chapter.id]}", style="dim"))


def _row(result: ExerciseResult, widths: tuple[int, int, int]) -> Text:
    """An exercise's name, status and points, in columns ``widths`` wide."""
    label, style = STATUS_STYLE[result.status]
    return Text.assemble(" ", result.exercise.name.ljust(widths[0]), _GAP, (label.ljust(widths[1]), style),
                         _GAP, _points(result).rjust(widths[2]))


def _points(result: ExerciseResult) -> str:
    return f"{result.score} / {result.exercise.points}"


def _details(result: ExerciseResult) -> Text:
    """A row's reason, and its note on a line of its own."""
    # Text, not markup: a reason may quote the student's own "[...]" (or an escape sequence).
    details = Text(_visible(result.reason))
    if result.note:  # whatever the status: a note (the static scan's, say) costs no point
        details.append(f"\nnote: {_visible(result.note)}", style="yellow")
    return details


def _print_failures(report: GradeReport, console: Console, verbose: bool) -> None:
    """Why each failed exercise failed: its first failed check in full, and
    the first that timed out (it cost the exercise its other checks); with
    ``verbose``, every one, those that failed alike once. What its row says
    already is not said again; an exercise whose file could not be graded
    at all has its reason under the chapter's title."""
    for result in report.exercises:
        if result.status != Status.FAILED or result.chapter.id in report.problems:
            continue
        groups = _alike(result.failed_checks)
        if not verbose:
            groups = [group for group in _first_and_timeout(groups) if not _said_in_row(group[0], result)]
        if not groups:
            continue
        console.print(Text(f"{result.chapter.id} {result.exercise.name}", style="bold red"))
        for check, *same in groups:
            console.print(_indented(check.check, 2, "bold"))
            console.print(_indented(_visible(check.message), 4))
            if check.hint and not result.reason.startswith(check.hint):  # a row gives its first hint
                console.print(_indented(f"hint: {check.hint}", 4, "cyan"))
            if verbose and same:
                console.print(_indented(f"and {len(same)} more check{'s' if len(same) > 1 else ''} "
                                        "that failed the same way", 4, "dim"))
            if verbose and check.details:
                console.print(Text(check.details, style="dim"))


def _alike(checks: list[CheckResult]) -> list[list[CheckResult]]:
    """Failed checks grouped by what they say (a timeout that skipped the
    exercise's other checks says it to each), in the order they ran."""
    groups: dict[tuple, list[CheckResult]] = {}
    for check in checks:
        groups.setdefault((check.kind, check.message, check.hint, check.details), []).append(check)
    return list(groups.values())


def _first_and_timeout(groups: list[list[CheckResult]]) -> list[list[CheckResult]]:
    """The first group, and the first that timed out if it did not: a
    timeout cost the exercise its other checks, and says where it looped."""
    first = groups[:1]
    if first and first[0][0].kind != Failure.TIMEOUT:
        first += [group for group in groups if group[0].kind == Failure.TIMEOUT][:1]
    return first


def _said_in_row(check: CheckResult, result: ExerciseResult) -> bool:
    """Whether the exercise's row already says all a check has to say."""
    return result.reason.startswith(check.message) and not check.hint


def _indented(text: str, spaces: int, style: str = "") -> Padding:
    """``text`` indented, its wrapped lines too (a narrow terminal wraps
    most messages)."""
    return Padding(Text(text, style=style), (0, 0, 0, spaces))


def _print_printed(report: GradeReport, console: Console, verbose: bool) -> None:
    """What the student's code printed, as its own text: with ``verbose``,
    each place's (the file's top level, an exercise's calls during its
    checks), bounded; otherwise one line that says it is hidden. It is data
    from the worker, never graded: shown as plain text, never as markup or
    a terminal's control sequence."""
    places = [(chapter, where, printed) for chapter, found in report.printed.items()
              for where, printed in found.items() if printed]
    if not places:
        return
    if not verbose:
        size = sum(len(printed.text) + printed.more for _, _, printed in places)
        console.print(Text(f"note: your code printed {size:,} characters, not shown: grade with -v to see them",
                           style="dim"))
        return
    for chapter, where, printed in places:
        console.print(Text(f"printed by your code {_place(chapter, where)}:", style="bold"))
        console.print(_indented(_visible(printed.text.rstrip("\n")), 4))
        if printed.more:
            console.print(_indented(f"... and {printed.more:,} more characters, not shown", 4, "dim"))


def _place(chapter: str, where: str) -> str:
    return f"at the top level of {chapter}'s file" if where == TOP_LEVEL else f"in {chapter} {where}'s checks"


def _visible(text: str) -> str:
    """``text`` with its control characters written as escapes (``\\x1b``):
    what a student's code printed (or put in an exception's message) shows
    as it was written, and never moves the cursor, clears the screen or
    changes the terminal's colours."""
    return "".join(character if character in "\n\t" or character.isprintable()
                   else repr(character)[1:-1] for character in text)


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
