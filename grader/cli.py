"""The ``mha-course`` command: a student's ``grade`` and ``list``; the
instructor's ``verify``, ``build``, ``release``, ``batch`` and ``gradescope``,
which the student edition hides and refuses in one line.

Errors in what was asked (an unknown chapter, a missing file or folder) are
one red line on stderr and exit status 2; a grade exits 0 when every check
passed and 1 otherwise. torch is imported only by the commands that need it,
so ``list`` and ``--help`` answer at once.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

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

# The student edition shows a student's commands only; the instructor's are
# answered with one line (main), since they need solutions/ or tests/.
EDITION = is_student_edition()
INSTRUCTOR_COMMANDS = ("verify", "batch", "release", "gradescope", "build")

app = typer.Typer(
    help="Grade the exercises of the attention course." if EDITION else
    "Grade the exercises of the attention course, and build them from the solutions.",
    add_completion=False,
    pretty_exceptions_enable=False,
)
instructor_command = app.command(hidden=EDITION)  # as @app.command(), hidden in the edition
stdout = Console()
stderr = Console(stderr=True)

USAGE_ERROR = 2
INTERRUPTED = 130


class Device(str, enum.Enum):
    cpu = "cpu"
    cuda = "cuda"
    auto = "auto"


def usage_error(message: str) -> NoReturn:
    stderr.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(USAGE_ERROR)


def resolve_targets(targets: list[str], directory: Path) -> list[tuple[Chapter, Path, str]]:
    """Turn command-line targets into ``(chapter, file, why that file)``.

    A target is a chapter (``ch01``, ``1``, ``01_self_attention``), looked up
    in ``directory`` (``finding.chapter_choice``), or a path to a ``.py`` or
    ``.ipynb`` file. No target means every chapter whose file is in
    ``directory``. ``why`` is empty where there was no choice to make.
    """
    def folder() -> Path:
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
                if as_path.suffix not in SUBMISSION_SUFFIXES:
                    usage_error(f"{target}: only .py files and .ipynb notebooks can be graded")
                if not as_path.is_file():
                    usage_error(f"no such file: {target}")
                chapter, path, why = chapter_for_file(as_path), as_path, ""
            else:
                chapter = find_chapter(target)
                choice = chapter_choice(chapter, folder())
                if choice is None:
                    usage_error(f"no file {folder() / chapter.module}.py (or .ipynb) for {chapter.id}")
                path, why = choice
        except UnknownChapter as error:
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


def _device(choice: Device):
    # Ask NVML, not the CUDA runtime: the grader must not initialise CUDA
    # before it forks workers, which initialise it themselves.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    if choice is Device.cpu:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if choice is Device.auto:
        return torch.device("cpu")
    usage_error(f"--device cuda: CUDA is not available here (torch {torch.__version__}); "
                "use --device cpu or auto")


# What grade and watch are both given.
Targets = Annotated[list[str] | None, typer.Argument(
    help="Chapters (ch01, 1, 01_self_attention), .py files or .ipynb notebooks; none means "
    "every chapter found (of a .py and an .ipynb, the one with more work, then the one saved last).",
    show_default=False)]
Folder = Annotated[Path | None, typer.Option(
    "--dir", help="Folder holding the submission.  \\[default: exercises/]", show_default=False)]
Where = Annotated[Device, typer.Option(help="Where the checks run.")]
Timeout = Annotated[float, typer.Option(
    help="Seconds one check may take; an exercise may take four times that.", min=0.1)]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="List every failed check, not only the first.")]


@app.command()
def grade(
    targets: Targets = None,
    directory: Folder = None,
    solutions: Annotated[bool, typer.Option(
        "--solutions", help="Grade the reference solutions (same as --dir solutions).",
        hidden=EDITION)] = False,
    device: Where = Device.cpu,
    timeout: Timeout = 10.0,
    seed: Annotated[int | None, typer.Option(
        help="Seed of the random inputs, to replay a run.  \\[default: a fresh one]",
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
    where = _device(device)

    from grader.grading import GraderError, UnrecordedSeed
    from grader.grading import grade as run_grade
    from grader.isolation import missing
    from grader.report import print_json, print_table
    from grader.sandbox import Limits, layers
    from grader.shards import default_processes

    limits = Limits.per_check(timeout)
    try:
        report = run_grade([(chapter, path) for chapter, path, _ in chosen], where, limits, seed,
                           jobs=default_processes())
        report.sources = sources
    except UnrecordedSeed as error:  # the student edition grades with its recorded seeds only
        usage_error(str(error))
    except GraderError as error:
        stderr.print(f"[bold red]grader error:[/] {escape(str(error))}", highlight=False)
        raise typer.Exit(3) from None
    unprotected = missing(layers())
    if unprotected:  # on stderr: stdout may be the JSON a program reads
        stderr.print(f"[yellow]warning:[/] {escape(unprotected)}", highlight=False, soft_wrap=True)
    if as_json:
        print_json(report)
    else:
        print_table(report, stdout, verbose)
    raise typer.Exit(0 if report.passed else 1)


@app.command()
def watch(
    targets: Targets = None,
    directory: Folder = None,
    device: Where = Device.cpu,
    timeout: Timeout = 10.0,
    seed: Annotated[int | None, typer.Option(
        help="Seed of the random inputs.  \\[default: a fresh one each time]", show_default=False)] = None,
    verbose: Verbose = False,
) -> None:
    """Grade, then grade again each time a file is saved; Ctrl-C stops."""
    import time

    folder = directory or COURSE_ROOT / "exercises"
    chosen = resolve_targets(targets or [], folder)  # a wrong target is told at once
    where = _device(device)

    from grader.grading import GraderError, preload
    from grader.grading import grade as run_grade
    from grader.report import print_table
    from grader.sandbox import Limits
    from grader.shards import default_processes
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

    run_watch(files, regrade)


@instructor_command
def verify(
    seed: Annotated[int | None, typer.Option(
        help="Seed of the random inputs.  \\[default: a fresh one]", show_default=False)] = None,
    jobs: Annotated[int, typer.Option(
        help="Processes grading known bugs side by side.  \\[default: one per core]",
        show_default=False, min=0)] = 0,
    matrix: Annotated[bool, typer.Option(
        "--matrix", help="Also show, for each exercise, which checks catch which known bug.")] = False,
) -> None:
    """Prove the checks (for instructors).

    The reference passes, the stub fails, every known bug is caught, the
    generated files are up to date."""
    import secrets

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from grader.grading import GraderError
    from grader.report import print_verification
    from grader.verify import verify as run_verify

    seed = secrets.randbelow(2**31) if seed is None else seed
    columns = (TextColumn("grading known bugs"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    try:
        with Progress(*columns, console=stderr, transient=True) as progress:
            task = progress.add_task("bugs", total=None)
            result = run_verify(seed, jobs or os.cpu_count() or 1,
                                lambda done, total: progress.update(task, completed=done, total=total))
    except GraderError as error:
        stderr.print(f"[bold red]grader error:[/] {escape(str(error))}", highlight=False)
        raise typer.Exit(3) from None
    print_verification(result, stdout, matrix)
    stdout.print(f"seed {seed}", style="dim", highlight=False)
    raise typer.Exit(0 if result.passed else 1)


@instructor_command
def batch(
    submissions: Annotated[Path, typer.Argument(
        help="Folder with one entry per student: a folder laid out like exercises/, a single .py "
        "or .ipynb with chNN in its name (alice_ch01.py), or a .zip of either. The student's id "
        "is the entry's name without .zip, .py or .ipynb.", show_default=False)],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Folder for grades.csv, results/STUDENT.json (Gradescope) and the state of "
        "the last run.  \\[default: grades/ beside SUBMISSIONS]", show_default=False)] = None,
    jobs: Annotated[int, typer.Option(
        help="Students graded side by side.  \\[default: one per core]", show_default=False, min=0)] = 0,
    force: Annotated[bool, typer.Option(
        "--force", help="Grade every student again, not only those whose submission changed.")] = False,
    timeout: Annotated[float, typer.Option(
        help="Seconds one check may take; an exercise may take four times that.", min=0.1)] = 10.0,
    seed: Annotated[int | None, typer.Option(
        help="Seed of the random inputs, the same for every student.  \\[default: a fresh one]",
        show_default=False)] = None,
) -> None:
    """Grade a whole class (for instructors), on the CPU.

    A CSV row and a Gradescope results.json per student, and a summary of
    the class.

    Only the chapters a student submitted are graded; the exercises of the
    other chapters score 0. A submission that cannot be graded (an empty
    folder, a corrupt zip, a notebook that is not JSON, a file whose chapter
    cannot be told) gets a row with the reason in the note column. A re-run
    grades only the students whose files changed (--force: all of them), and
    everyone again when the checks or the solutions changed. Exit status 0
    whatever the students scored."""
    import secrets

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if not submissions.is_dir():
        usage_error(f"no such directory: {submissions}" if not submissions.exists()
                    else f"{submissions} is not a folder (expected one entry per student in it)")
    out = out if out is not None else submissions.resolve().parent / "grades"
    if out.exists() and not out.is_dir():
        usage_error(f"--out {out} exists and is not a folder")
    if out.resolve() == submissions.resolve():
        usage_error(f"the out folder {out} is the submissions folder itself: choose another with --out")

    from grader.batch import GradingOptions, print_summary, run_batch
    from grader.class_folder import entry_paths

    try:
        if not entry_paths(submissions, out):
            usage_error(f"{submissions} holds no submissions (one folder, file or zip per student)")
    except OSError as error:
        usage_error(f"cannot list {submissions}: {error.strerror}")
    seed = secrets.randbelow(2**31) if seed is None else seed
    columns = (TextColumn("grading students"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[broken]} not gradable"), TimeRemainingColumn())
    try:
        with Progress(*columns, console=stderr, transient=True) as progress:
            task = progress.add_task("students", total=None, broken=0)
            result = run_batch(
                submissions, out, GradingOptions(seed, timeout), jobs or os.cpu_count() or 1, force,
                lambda done, total, broken: progress.update(task, completed=done, total=total, broken=broken))
    except OSError as error:  # the out folder cannot be written, SUBMISSIONS cannot be read
        usage_error(f"{error.filename or out}: {error.strerror}")
    print_summary(result, stdout)


@instructor_command
def release(
    folder: Annotated[Path, typer.Argument(
        help="Where the edition goes: a new or empty folder outside the course.", show_default=False)],
    seed: Annotated[list[int] | None, typer.Option(
        "--seed", help="A seed to record (repeat the option for several); students grade with these "
        "only.  \\[default: four fresh ones]", show_default=False)] = None,
    jobs: Annotated[int, typer.Option(
        help="Processes recording seeds side by side.  \\[default: one per core]",
        show_default=False, min=0)] = 0,
) -> None:
    """Write the student edition (for instructors).

    Lessons, stubs, notebooks and the grader, with answers recorded from the
    reference instead of its code."""
    from grader.edition import ReleaseError, write_edition
    from grader.recorded import is_edition

    if is_edition():
        usage_error("this is a student edition: release from the instructor's tree")
    with stderr.status("recording the reference's answers"):
        try:
            done = write_edition(folder, seed, jobs or os.cpu_count() or 1)
        except ReleaseError as error:
            usage_error(str(error))
    size = sum(done.recorded_bytes.values())
    stdout.print(f"wrote {done.files} files to {done.folder}: recordings of seeds "
                 f"{', '.join(map(str, done.seeds))} ({size / 1024:.0f} KB)", highlight=False)


class Visibility(str, enum.Enum):
    """When Gradescope shows students their results (Gradescope's own values)."""

    visible = "visible"
    after_due_date = "after_due_date"
    after_published = "after_published"
    hidden = "hidden"


@instructor_command
def gradescope(
    out: Annotated[Path, typer.Argument(
        help="The zip to write, e.g. autograder.zip.", show_default=False)],
    chapter: Annotated[list[str] | None, typer.Option(
        "--chapter", "-c", help="A chapter the assignment grades (repeat the option for several).  "
        "\\[default: every chapter]", show_default=False)] = None,
    visibility: Annotated[Visibility, typer.Option(
        help="When students see their results on Gradescope.")] = Visibility.visible,
    timeout: Annotated[float, typer.Option(
        help="Seconds one check may take; an exercise may take four times that.", min=0.1)] = 10.0,
) -> None:
    """Write a Gradescope autograder (for instructors).

    Upload OUT as the autograder of a programming assignment; students
    submit their chNN_topic.py or .ipynb files."""
    from grader.gradescope import BundleError, write_bundle

    if out.suffix != ".zip":
        usage_error(f"{out}: the autograder must be a .zip file (e.g. autograder.zip)")
    if out.is_dir():
        usage_error(f"{out} is a folder; name the zip file to write")
    if not out.parent.is_dir():
        usage_error(f"no such directory: {out.parent}")
    try:
        chapters = [find_chapter(name) for name in chapter or []] or list(CHAPTERS)
    except UnknownChapter as error:
        usage_error(str(error))
    chapters = sorted(set(chapters), key=lambda c: c.number)
    try:
        names = write_bundle(out, chapters, visibility.value, timeout)
    except BundleError as error:
        usage_error(str(error))
    except OSError as error:
        usage_error(f"cannot write {out}: {error.strerror or error}")
    points = sum(c.points for c in chapters)
    stdout.print(f"wrote {out}: {len(names)} files; grades {', '.join(c.id for c in chapters)} "
                 f"({points} points), results {visibility.value}.", highlight=False, soft_wrap=True)


@app.command("list")
def list_exercises() -> None:
    """List the chapters and their exercises, with points."""
    from rich import box

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


@instructor_command
def build(
    check: Annotated[bool, typer.Option(
        "--check", help="Write nothing; exit 1 if a generated file is out of date.")] = False,
    with_solutions: Annotated[Path | None, typer.Option(
        "--with-solutions", help="Instead, write the notebooks with the reference code filled in "
        "into this folder.", show_default=False)] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Overwrite exercise files that hold edits too, keeping a copy of each "
        "(NAME.DATE-TIME.bak).")] = False,
) -> None:
    """Write exercises/ and the figures from solutions/ (for course authors).

    An exercise file that differs from what the build last wrote there holds
    someone's work: it is named and left alone, unless --force."""
    from grader.build import (
        MarkerError,
        edited_files,
        generated_files,
        solution_notebooks,
        stale_files,
        write_files,
    )

    if with_solutions is not None and check:
        usage_error("use either --check or --with-solutions, not both")
    if with_solutions is not None and with_solutions.exists() and not with_solutions.is_dir():
        usage_error(f"{with_solutions} exists and is not a folder")
    try:
        files = solution_notebooks(with_solutions) if with_solutions else generated_files()
    except (MarkerError, OSError, ValueError) as error:
        usage_error(str(error))

    def shown(path: Path) -> Path:
        return path.relative_to(COURSE_ROOT) if path.is_relative_to(COURSE_ROOT) else path

    if check:
        edited = set(edited_files(files))
        stale = stale_files(files)
        for path in stale:
            what = "holds edits, not the build's text" if path in edited else "out of date"
            stderr.print(f"{what}: {shown(path)}", highlight=False)
        raise typer.Exit(1 if stale else 0)
    try:
        changed, edited = write_files(files, force=force)
    except OSError as error:
        usage_error(f"cannot write {error.filename}: {error.strerror}")
    for path in changed:
        stdout.print(f"wrote {shown(path)}", highlight=False)
    for path, copy in edited.items():
        if copy is None:
            stderr.print(f"left {shown(path)} as it is: it holds edits the build did not write "
                         "(mha-course build --force overwrites it, keeping a copy)", style="yellow",
                         highlight=False)
        else:
            stderr.print(f"kept a copy of your edits to {shown(path)} as {copy.name}", style="yellow",
                         highlight=False)
    stdout.print(f"{len(files)} generated files, {len(changed)} changed.")


def main(argv: list[str] | None = None) -> None:
    """Run the command line; usage errors, typer's included, are one line."""
    args = sys.argv[1:] if argv is None else argv
    if EDITION and args and args[0] in INSTRUCTOR_COMMANDS:
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
        stderr.print(f"[bold red]error:[/] {escape(error.format_message())} (see mha-course --help)",
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
