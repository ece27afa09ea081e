"""The ``mha-course`` command: a student's ``grade``, ``watch`` and ``list``,
and ``main``, which runs them all; what every command shares is in
``grader.app``. The instructor's ``verify``, ``build``, ``release``,
``batch`` and ``gradescope`` are in ``grader.instructor_commands``, which
the student edition hides and refuses in one line.

Errors in what was asked (an unknown chapter, a missing file or folder) are
one red line on stderr and exit status 2; a grade exits 0 when every check
passed and 1 otherwise. torch is imported only by the commands that need it,
so ``list`` and ``--help`` answer at once; and a student's command imports
neither the instructor's commands (``main`` registers them only when one of
them, or the list of all, is asked for) nor what only another command shows
(``tests/test_startup.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.markup import escape

from grader.app import (
    INSTRUCTOR_COMMANDS,
    INTERRUPTED,
    USAGE_ERROR,
    Command,
    Device,
    Timeout,
    Where,
    app,
    chosen_device,
    stderr,
    stdout,
    student_command,
    usage_error,
)
from grader.catalog import (
    CHAPTERS,
    COURSE_ROOT,
    SUBMISSION_SUFFIXES,
    Chapter,
    UnknownChapter,
    chapter_for_file,
    find_chapter,
    is_student_edition,
)
from grader.finding import chapter_choice


def resolve_targets(targets: list[str], directory: Path) -> list[tuple[Chapter, Path, str]]:
    """Turn command-line targets into ``(chapter, file, why that file)``.

    A target is a chapter (``ch01``, ``1``, ``01_self_attention``), looked up
    in ``directory`` (``finding.chapter_choice``), or a path to a ``.py`` or
    ``.ipynb`` file. No target means every chapter whose file is in
    ``directory``. ``why`` is empty where there was no choice to make.
    """
    def folder() -> Path:
        if directory.is_file():
            instead = ": name it as a target, without --dir" if directory.suffix in SUBMISSION_SUFFIXES else ""
            usage_error(f"--dir {directory} is a file, not a folder{instead}")
        if not directory.is_dir():
            usage_error(f"no such directory: {directory}")
        return directory

    if not targets:
        found = [(c, chapter_choice(c, folder())) for c in CHAPTERS]
        found = [(c, *choice) for c, choice in found if choice is not None]
        if not found:
            usage_error(f"no exercise files in {directory} (expected names like "
                        f"{CHAPTERS[0].module}.py or .ipynb)")
        return found
    chosen: dict[str, tuple[Chapter, Path, str]] = {}
    for target in targets:
        as_path = Path(target)
        try:
            if as_path.suffix or as_path.is_file():
                if as_path.is_dir():
                    usage_error(f"{target} is a folder, not a file: to grade the files in it, "
                                f"use --dir {target}")
                if as_path.suffix not in SUBMISSION_SUFFIXES:
                    usage_error(f"{target}: only .py files and .ipynb notebooks can be graded")
                if not as_path.is_file():
                    usage_error(f"no such file: {target}")
                chapter, path, why = chapter_for_file(as_path), as_path, ""
            else:
                chapter = find_chapter(target)
                choice = chapter_choice(chapter, folder())
                if choice is None:
                    usage_error(f"no file for {chapter.id} in {folder()} (expected {chapter.module}.py or "
                                f".ipynb, or a name with {chapter.id} as a word, such as alice_{chapter.id}.py)")
                path, why = choice
        except UnknownChapter as error:
            if as_path.is_dir():  # a chapter's name first, then a folder of that name
                usage_error(f"{target} is a folder: to grade the files in it, use --dir {target}")
            if target.lower() in ("true", "false"):  # --solutions true, --json false
                usage_error(f"unknown chapter {target!r}: a flag (--solutions, --json, --verbose) "
                            "takes no value")
            usage_error(str(error))
        if chapter.id in chosen and chosen[chapter.id][1].resolve() != path.resolve():
            usage_error(f"two files for {chapter.id}: {chosen[chapter.id][1]} and {path}")
        chosen[chapter.id] = (chapter, path, why)
    return list(chosen.values())


def _shown(path: Path) -> str:
    """A graded file as the student finds it: from the current folder when
    it is below it, else in full (another tree's exercises/, say)."""
    path = path.absolute()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def _sources(chosen: list[tuple[Chapter, Path, str]]) -> dict[str, str]:
    """What a report says it graded, by chapter id: the file, and why that one."""
    return {chapter.id: _shown(path) + (f" ({why})" if why else "") for chapter, path, why in chosen}


# What grade and watch are both given.
Targets = Annotated[list[str] | None, typer.Argument(
    help="Chapters (ch01, 1, 01_self_attention), .py files or .ipynb notebooks; none means "
    "every chapter found (of a .py and an .ipynb, the one with more work, then the one saved last).",
    show_default=False)]
Folder = Annotated[Path | None, typer.Option(
    "--dir", help="Folder holding the submission.  \\[default: exercises/]", show_default=False)]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="List every failed check, not only the first.")]
# The student edition grades with the seeds it recorded (grader.recorded), never a fresh one.
WHICH_SEEDS, DEFAULT_SEED = ((": one of the seeds this edition recorded, the only ones it grades with",
                              "one of them, at random") if is_student_edition() else ("", "a fresh one"))


@student_command
def grade(
    targets: Targets = None,
    directory: Folder = None,
    solutions: Annotated[bool, typer.Option(
        "--solutions", help="Grade the reference solutions (same as --dir solutions).",
        hidden=is_student_edition())] = False,
    device: Where = Device.cpu,
    timeout: Timeout = 10.0,
    seed: Annotated[int | None, typer.Option(
        help=f"Seed of the random inputs, to replay a run{WHICH_SEEDS}.  \\[default: {DEFAULT_SEED}]",
        show_default=False)] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print Gradescope's results.json on stdout instead of a table.")] = False,
    verbose: Verbose = False,
) -> None:
    """Grade a submission: one row per exercise, with points and the reason."""
    if solutions and directory is not None:
        usage_error("use either --solutions or --dir, not both")
    folder = COURSE_ROOT / "solutions" if solutions else directory or COURSE_ROOT / "exercises"
    chosen = resolve_targets(targets or [], folder)
    sources = _sources(chosen)
    where = chosen_device(device)

    from grader.sandbox import Limits, clean_parent, layers
    from grader.side_by_side import default_processes

    # Before the grading modules: the workers' fork servers come from a
    # process that never read a check, the reference or a known bug.
    processes = min(default_processes(), len(chosen))
    with clean_parent(processes):
        from grader.grading import GraderError, UnrecordedSeed
        from grader.grading import grade as run_grade

        limits = Limits.per_check(timeout)
        try:
            report = run_grade([(chapter, path) for chapter, path, _ in chosen], where, limits, seed,
                               jobs=processes)
            report.sources = sources
        except UnrecordedSeed as error:  # the student edition grades with its recorded seeds only
            usage_error(str(error))
        except GraderError as error:
            stderr.print(f"[bold red]grader error:[/] {escape(str(error))}", highlight=False)
            raise typer.Exit(3) from None

    from grader.isolation import missing
    from grader.report import print_json, print_table

    unprotected = missing(layers())
    if unprotected:  # on stderr: stdout may be the JSON a program reads
        stderr.print(f"[yellow]warning:[/] {escape(unprotected)}", highlight=False, soft_wrap=True)
    if as_json:
        print_json(report)
    else:
        print_table(report, stdout, verbose)
    raise typer.Exit(0 if report.passed else 1)


@student_command
def watch(
    targets: Targets = None,
    directory: Folder = None,
    device: Where = Device.cpu,
    timeout: Timeout = 10.0,
    seed: Annotated[int | None, typer.Option(
        help=f"Seed of the random inputs{WHICH_SEEDS}.  \\[default: {DEFAULT_SEED} each time]",
        show_default=False)] = None,
    verbose: Verbose = False,
) -> None:
    """Grade, then grade again each time a file is saved; Ctrl-C stops."""
    import time

    from rich.text import Text

    folder = directory or COURSE_ROOT / "exercises"
    chosen = resolve_targets(targets or [], folder)  # a wrong target is told at once
    where = chosen_device(device)

    from grader.sandbox import Limits, clean_parent, preload
    from grader.watching import watch as run_watch

    limits = Limits.per_check(timeout)
    # What the chapters' correct code imports at a cost, once here rather than in every regrade.
    preload(chapter for chapter, _, _ in chosen)

    def files() -> list[Path]:
        # The chosen files and, for a chapter, its other file: a student may move to the notebook.
        return sorted({path for _, path, _ in chosen} |
                      {folder / f"{chapter.module}{suffix}" for chapter, _, _ in chosen
                       for suffix in SUBMISSION_SUFFIXES})

    def regrade() -> None:
        # Imported here, once the clean parent below is forked: no worker holds what they read.
        from grader.grading import GraderError
        from grader.grading import grade as run_grade
        from grader.report import print_table
        from grader.side_by_side import default_processes

        try:
            now = resolve_targets(targets or [], folder)
        except typer.Exit:  # a file gone for a moment: said on stderr; the next save tries again
            return
        stdout.rule(f"{time.strftime('%H:%M:%S')} · {', '.join(chapter.id for chapter, _, _ in now)}",
                    style="dim")
        try:
            report = run_grade([(chapter, path) for chapter, path, _ in now], where, limits, seed,
                               jobs=default_processes())
        except GraderError as error:
            stderr.print(f"[bold red]grader error:[/] {escape(str(error))}", highlight=False)
            return
        report.sources = _sources(now)
        print_table(report, stdout, verbose)
        stdout.print(Text("watching; save to grade again, Ctrl-C to stop", style="dim"))

    # Every regrade's workers come from a process forked now, before the
    # first regrade reads the checks, the reference and the known bugs.
    with clean_parent():
        run_watch(files, regrade)


@app.command("list", cls=Command)
def list_exercises() -> None:
    """List the chapters and their exercises, with points."""
    from rich import box
    from rich.table import Table

    # A table per chapter, as grade prints them: at 80 columns the names and
    # points stay whole and only the descriptions wrap.
    for chapter in CHAPTERS:
        table = Table(title=f"{chapter.id} · {chapter.title} · {chapter.points} points", title_justify="left",
                      title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, expand=True)
        table.add_column("exercise", no_wrap=True)
        table.add_column("points", justify="right", no_wrap=True)
        table.add_column("what it is", min_width=20, ratio=1)
        for exercise in chapter.exercises:
            table.add_row(exercise.name, str(exercise.points), exercise.summary)
        stdout.print(table)
    total = sum(chapter.points for chapter in CHAPTERS)
    stdout.print(f"{len(CHAPTERS)} chapter(s), {total} points. Grade one with: mha-course grade ch01")


# Registered on app by this module; the instructor's, by importing instructor_commands.
STUDENT_COMMANDS = ("grade", "watch", "list")


def main(argv: list[str] | None = None) -> None:
    """Run the command line; usage errors, typer's included, are one line."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in STUDENT_COMMANDS:
        # Registers them on app, after the student's commands, as --help lists
        # them: only where they may be asked for (an instructor's command,
        # --help, an unknown command), since typer builds every registered
        # command's parameters on every run.
        from grader import instructor_commands  # noqa: F401
    if args and args[0] in INSTRUCTOR_COMMANDS and is_student_edition():
        stderr.print(f"[bold red]error:[/] mha-course {args[0]} belongs to the instructor's tree; "
                     "this is the student edition (see mha-course --help)", highlight=False, soft_wrap=True)
        sys.exit(USAGE_ERROR)
    try:
        code = app(args or ["--help"], standalone_mode=False, prog_name="mha-course")
    except KeyboardInterrupt:
        code = INTERRUPTED
    except Exception as error:
        # typer's (or click's) usage errors: a bad option value, an unknown command.
        if not (hasattr(error, "format_message") and hasattr(error, "exit_code")):
            raise
        # typer 0.29 checks a value through pydantic, whose message for a choice
        # starts "Value error, ": the rest is what click says of a choice.
        message = error.format_message().replace(": Value error, ", ": ", 1)
        context = getattr(error, "ctx", None)  # the (sub)command that refused it
        where = context.command_path if context is not None else "mha-course"
        stderr.print(f"[bold red]error:[/] {escape(message)} (see {escape(where)} --help)",
                     highlight=False, soft_wrap=True)
        sys.exit(error.exit_code or USAGE_ERROR)
    if code == INTERRUPTED:  # Ctrl-C; typer itself turns it into this status
        stderr.print("interrupted")
    sys.exit(code or 0)


def run() -> NoReturn:
    """The ``mha-course`` program: ``main``, then a quick exit.

    Everything is written and closed by then; what a normal exit would add
    is the teardown of torch's and pytest's modules, which nobody waits
    for gladly. Exit handlers still run.
    """
    try:
        main()
        code: object = 0
    except SystemExit as done:
        code = done.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a closed pipe (| head) has nothing to lose
            stream.flush()
    atexit._run_exitfuncs()
    os._exit(code or 0)
