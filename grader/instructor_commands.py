"""The instructor's commands of ``mha-course``: ``verify``, ``batch``,
``release``, ``gradescope``, ``prairielearn`` and ``build``. They register on ``grader.app``'s
app (``grader.cli`` imports this module to have them), hidden in the student
edition, which answers them in one line since they need solutions/ or tests/.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from grader.app import Device, Timeout, Where, chosen_device, instructor_command, stderr, stdout, usage_error
from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter, UnknownChapter, find_chapter, is_student_edition


@instructor_command
def verify(
    seed: Annotated[int | None, typer.Option(
        help="Seed of the random inputs.  \\[default: a fresh one]", show_default=False)] = None,
    jobs: Annotated[int, typer.Option(
        help="Processes grading known bugs side by side.  \\[default: one per core]",
        show_default=False, min=0)] = 0,
    matrix: Annotated[bool, typer.Option(
        "--matrix", help="Also show, for each exercise, which checks catch which known bug.")] = False,
    device: Where = Device.cpu,
    chapter: Annotated[list[str] | None, typer.Option(
        "--chapter", "-c", metavar="<chapter>",
        help="A chapter to prove (repeat the option for several).  \\[default: every chapter]",
        show_default=False)] = None,
) -> None:
    """Prove the checks (for instructors).

    The reference passes, the stub fails, every known bug is caught, the
    generated files are up to date."""
    import secrets

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from grader.grading import GraderError
    from grader.report import print_verification
    from grader.verify import verify as run_verify

    where = chosen_device(device)
    chapters = _chapters(chapter)
    seed = secrets.randbelow(2**31) if seed is None else seed
    columns = (TextColumn("grading known bugs"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    try:
        with Progress(*columns, console=stderr, transient=True) as progress:
            task = progress.add_task("bugs", total=None)
            result = run_verify(seed, jobs or os.cpu_count() or 1,
                                lambda done, total: progress.update(task, completed=done, total=total),
                                device=where, chapters=chapters)
    except GraderError as error:
        stderr.print(f"[bold red]grader error:[/] {escape(str(error))}", highlight=False)
        raise typer.Exit(3) from None
    print_verification(result, stdout, matrix)
    stdout.print(f"seed {seed}", style="dim", highlight=False)
    raise typer.Exit(0 if result.passed else 1)


def _chapters(names: list[str] | None) -> tuple[Chapter, ...]:
    """The chapters of ``--chapter`` options, in course order, each once;
    every chapter when there is none. A name the course lacks is a usage error."""
    try:
        chapters = {find_chapter(name) for name in names or []}
    except UnknownChapter as error:
        usage_error(str(error))
    return tuple(sorted(chapters, key=lambda chapter: chapter.number)) or CHAPTERS


@instructor_command
def batch(
    submissions: Annotated[Path, typer.Argument(
        metavar="SUBMISSIONS",
        help="Folder with one entry per student: a folder laid out like exercises/, the student's "
        "loose .py or .ipynb files with chNN in their names (bob_ch01.py and bob_ch04.py are bob), "
        "or a .zip of a folder. The student's id is the entry's name without .zip, .py or .ipynb "
        "(and a loose file's chapter).", show_default=False)],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Folder for grades.csv, results/STUDENT.json (Gradescope) "
        "and the state of the last run: a new one, or one of this class's and chapters' runs (any "
        "other is refused, so no grades are replaced or mixed).  \\[default: SUBMISSIONS-grades/ "
        "beside SUBMISSIONS; with --chapter, SUBMISSIONS-grades-ch01-ch04/]", show_default=False)] = None,
    chapter: Annotated[list[str] | None, typer.Option(
        "--chapter", "-c", metavar="<chapter>", help="A chapter to grade (repeat the option for several): "
        "the CSV has its exercises only and totals over them.  \\[default: every chapter]",
        show_default=False)] = None,
    jobs: Annotated[int, typer.Option(
        help="Students graded side by side.  \\[default: one per core]", show_default=False, min=0)] = 0,
    force: Annotated[bool, typer.Option(
        "--force", help="Grade every student again, not only those whose submission changed.")] = False,
    timeout: Timeout = 10.0,
    seed: Annotated[int | None, typer.Option(
        help="Seed of the random inputs, the same for every student.  \\[default: a fresh one]",
        show_default=False)] = None,
    cluster: Annotated[str | None, typer.Option(
        metavar="<address>", help="Grade each student as a task on a Dask cluster's workers, in the "
        "same sandbox as here: its scheduler's address (tcp://host:8786) or scheduler file. The workers "
        "set how many at once (no --jobs). Needs pip install -e \".\\[cluster]\" here and this same "
        "course on every worker.", show_default=False)] = None,
) -> None:
    """Grade a whole class (for instructors), on the CPU.

    A CSV row and a Gradescope results.json per student, and a summary of
    the class.

    Only the chapters a student submitted are graded (of --chapter, or of
    the course); the exercises of the others score 0. A submission that
    cannot be graded (an empty folder, a corrupt zip, a notebook that is not
    JSON, a file whose chapter cannot be told) gets a row with the reason in
    the note column. A re-run grades only the students whose files changed
    (--force: all of them), and everyone again when the checks or the
    solutions changed. Exit status 0 whatever the students scored."""
    import secrets

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from grader.batch_state import OutFolderTaken, Owner, claim, default_out

    if not submissions.is_dir():
        usage_error(f"no such directory: {submissions}" if not submissions.exists()
                    else f"{submissions} is not a folder (expected one entry per student in it)")
    if cluster is not None:
        from grader.cluster import PIP_HINT, available

        if jobs:
            usage_error("--jobs has no meaning with --cluster: the cluster's workers grade as many "
                        "students at once as they have threads")
        if not available():
            usage_error(PIP_HINT)
    chapters = _chapters(chapter)
    out = out if out is not None else default_out(submissions, chapters)
    if out.exists() and not out.is_dir():
        usage_error(f"--out {out} exists and is not a folder")
    if out.resolve() == submissions.resolve():
        usage_error(f"the out folder {out} is the submissions folder itself: choose another with --out")
    try:  # before torch loads: a refusal answers at once
        claim(out, Owner.of(submissions, chapters))
    except OutFolderTaken as error:
        usage_error(str(error))

    from grader.batch import GradingOptions, print_summary, run_batch
    from grader.class_folder import entry_paths
    from grader.cluster import ClusterError, on_cluster

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
                submissions, out, GradingOptions(seed, timeout, chapters), jobs or os.cpu_count() or 1, force,
                lambda done, total, broken: progress.update(task, completed=done, total=total, broken=broken),
                on_cluster(cluster) if cluster is not None else None)
    except OutFolderTaken as error:  # another batch took it since the check above
        usage_error(str(error))
    except ClusterError as error:  # what was graded is kept: a run once it is fixed goes on from there
        stderr.print(f"[bold red]cluster error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise typer.Exit(3) from None
    except OSError as error:  # the out folder cannot be written, SUBMISSIONS cannot be read
        usage_error(f"{error.filename or out}: {error.strerror}")
    print_summary(result, stdout)


@instructor_command
def release(
    folder: Annotated[Path, typer.Argument(
        help="Where the edition goes: a new or empty folder outside the course.", show_default=False)],
    seed: Annotated[list[int] | None, typer.Option(
        "--seed", metavar="<seed>",
        help="A seed to record (repeat the option for several); students grade with these only.  "
        "\\[default: four fresh ones]", show_default=False)] = None,
    jobs: Annotated[int, typer.Option(
        help="Processes recording seeds side by side.  \\[default: one per core]",
        show_default=False, min=0)] = 0,
) -> None:
    """Write the student edition (for instructors).

    Lessons, stubs, notebooks and the grader, with answers recorded from the
    reference instead of its code."""
    from grader.edition import ReleaseError, write_edition

    if is_student_edition():
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
    """When Gradescope shows students their results (Gradescope's own values).
    Listed in the option's help, where words wrap whole: as a metavar,
    ``visible|after_due_date|...`` is cut mid-word at 80 columns."""

    visible = "visible"
    after_due_date = "after_due_date"
    after_published = "after_published"
    hidden = "hidden"


@instructor_command
def gradescope(
    out: Annotated[Path, typer.Argument(
        metavar="OUT", help="The zip to write, e.g. autograder.zip.", show_default=False)],
    chapter: Annotated[list[str] | None, typer.Option(
        "--chapter", "-c", metavar="<chapter>", help="A chapter the assignment grades (repeat the "
        "option for several).  \\[default: every chapter]", show_default=False)] = None,
    visibility: Annotated[Visibility, typer.Option(
        metavar="<when>", help="When students see their results on Gradescope: "
        f"{', '.join(when.value for when in Visibility)}.")] = Visibility.visible,
    timeout: Timeout = 10.0,
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
    chapters = _chapters(chapter)
    try:
        names = write_bundle(out, chapters, visibility.value, timeout)
    except BundleError as error:
        usage_error(str(error))
    except OSError as error:
        usage_error(f"cannot write {out}: {error.strerror or error}")
    points = sum(c.points for c in chapters)
    stdout.print(f"wrote {out}: {len(names)} files; grades {', '.join(c.id for c in chapters)} "
                 f"({points} points), results {visibility.value}.", highlight=False, soft_wrap=True)


@instructor_command
def prairielearn(
    out: Annotated[Path, typer.Argument(
        metavar="OUT", help="A new or empty folder for the image's Dockerfile, the grader "
        "(serverFilesCourse/) and the questions.", show_default=False)],
    chapter: Annotated[list[str] | None, typer.Option(
        "--chapter", "-c", metavar="<chapter>", help="A chapter to make a question of (repeat the "
        "option for several).  \\[default: every chapter]", show_default=False)] = None,
    image: Annotated[str, typer.Option(
        metavar="<name>", help="The grading image's name on Docker Hub, which the questions use.")] = "mha-course/grader",
    timeout: Timeout = 10.0,
) -> None:
    """Write what PrairieLearn's external grader needs (for instructors).

    The grading image's Dockerfile, the grader to copy into the course's
    serverFilesCourse/, and one question a chapter; OUT/README.md says how to
    deploy them."""
    from grader.gradescope import BundleError
    from grader.prairielearn import write_course

    if out.exists() and not out.is_dir():
        usage_error(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        usage_error(f"{out} is not empty: choose a new or empty folder (nothing in it is replaced)")
    if not out.parent.is_dir():
        usage_error(f"no such directory: {out.parent}")
    if out.resolve().is_relative_to(COURSE_ROOT.resolve()):
        usage_error(f"{out} is inside the course: choose a folder outside it")
    chapters = _chapters(chapter)
    try:
        names = write_course(out, chapters, image, timeout)
    except BundleError as error:
        usage_error(str(error))
    except OSError as error:
        usage_error(f"cannot write {out}: {error.strerror or error}")
    stdout.print(f"wrote {out}: {len(names)} files; questions {', '.join(c.id for c in chapters)}, "
                 f"image {image}; next steps in {out / 'README.md'}.", highlight=False, soft_wrap=True)


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
    """Write exercises/ and the figures from solutions/, and each lesson's list of checks (for course authors).

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


@instructor_command  # typer names it new-chapter
def new_chapter(
    number: Annotated[str, typer.Argument(metavar="NN", help="The chapter's number: 9 or 09.", show_default=False)],
    slug: Annotated[str, typer.Argument(
        metavar="SLUG", help="Lowercase words joined by underscores, naming its files: sliding_window.",
        show_default=False)],
    title: Annotated[str, typer.Argument(
        metavar="TITLE", help="The lesson's title: \"Sliding-window attention\".", show_default=False)],
    exercises: Annotated[list[str] | None, typer.Option(
        "--exercise", metavar="NAME", help="An exercise's name, once for each, in order.  "
        "\\[default: one named example]", show_default=False)] = None,
) -> None:
    """Write the skeleton of a new chapter (for course authors).

    A first draft, with TODOs, of every file of grader/README.md's recipe
    ("Adding a chapter") that can be written now, the catalog's entry and
    README.md's row; never over a file that exists. Then mha-course verify
    and the test suite say what is left."""
    from grader.scaffold import EXAMPLE, ScaffoldError, next_steps, plan, write

    if not number.isdigit():
        usage_error(f"chapter number {number!r} is not a number such as 9 or 09")
    try:
        skeleton = plan(COURSE_ROOT, int(number), slug, title, tuple(exercises or (EXAMPLE,)))
        written = write(skeleton)
    except ScaffoldError as error:
        usage_error(str(error))
    except OSError as error:
        usage_error(f"cannot write {error.filename}: {error.strerror}")
    for path in written:
        stdout.print(f"wrote {path.relative_to(COURSE_ROOT)}", highlight=False)
    stdout.print("Left to do, in the order of grader/README.md's \"Adding a chapter\":", highlight=False)
    for step in next_steps(skeleton.chapter):
        stdout.print(f"- {step}", highlight=False, soft_wrap=True)
