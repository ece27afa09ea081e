"""Grade a whole class: ``mha-course batch SUBMISSIONS``.

SUBMISSIONS is a folder with one entry per student, and the student's id is
the entry's name (without ``.zip``, ``.py`` or ``.ipynb``, and a loose
file's without its chapter):

* a folder holding the chapters' files (``ch01_self_attention.py`` and/or
  ``.ipynb``, or a name holding ``chNN`` as a word, ``alice_ch01.ipynb``), at
  its top or in folders below it: ``finding.find_chapters`` picks each
  chapter's file, by the rule the Gradescope autograder follows;
* loose ``.py`` files or ``.ipynb`` notebooks, each one's chapter the
  ``chNN`` in its name: ``bob_ch01.py`` and ``bob_ch04.py`` are student ``bob``;
* a ``.zip`` of a folder, unpacked safely into a temporary folder.

Each student is graded on their own (one ``grade()`` call), in processes
forked from this one, so torch is imported once for the whole class; their
workers' fork servers come from a clean parent forked before any student
(``sandbox.clean_parent``). A batch grades the chapters it is given
(``GradingOptions.chapters``, every chapter by default), and only those a
student submitted; the others' exercises score 0. A submission that cannot
be graded is a row with the reason, never the end of the batch.

What a run writes into the out folder, which holds one class's grades of
one set of chapters (``batch_state.claim``): ``grades.csv`` (a row per
student, a column per exercise of the chapters graded),
``results/STUDENT.json`` (Gradescope's ``results.json`` schema; its output
names the file graded for each chapter and why that one) and
``batch-state.json`` (each student's content hash, row and seed, so that a
re-run grades only the submissions that changed, and says which seed the
rows it kept were graded with).
"""

from __future__ import annotations

import csv
import json
import os
import pickle
import select
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from grader import forkserver, isolation, reaping
from grader.batch_state import (
    CSV_FILE,
    RESULTS_FOLDER,
    Owner,
    StudentGrade,
    claim,
    grader_fingerprint,
    load_state,
    results_intact,
    results_path,
    save_state,
    sha256_text,
    write_atomically,
)
from grader.catalog import (
    CHAPTERS,
    Chapter,
)
from grader.class_folder import Entry, Unusable, list_entries, submission_targets
from grader.gradescope import with_missing_chapters
from grader.isolation import Limits

# torch and the grading modules are imported inside the functions that grade,
# so that the command line's checks of its arguments answer before torch loads.


@dataclass
class BatchResult:
    """What ``run_batch`` did: every student's row, sorted by id, and which
    were graded now (the others were unchanged and kept)."""

    grades: list[StudentGrade]
    graded_now: set[str]
    checks_changed: bool  # since the last run: every student was graded again
    out: Path
    seed: int
    unprotected: str = ""  # which of the sandbox's protections this machine lacks (isolation.missing)
    chapters: tuple[Chapter, ...] = CHAPTERS  # those the batch graded: the CSV's columns


def exercise_key(chapter: Chapter, exercise_name: str) -> str:
    """The CSV column of an exercise: ``ch01/softmax``."""
    return f"{chapter.id}/{exercise_name}"


def exercise_keys(chapters: tuple[Chapter, ...]) -> list[str]:
    """The CSV's exercise columns: every exercise of ``chapters``, in order."""
    return [exercise_key(chapter, exercise.name) for chapter in chapters for exercise in chapter.exercises]


# -- grading one student (in a pool worker) -----------------------------------------


@dataclass(frozen=True)
class GradingOptions:
    """What every student is graded with: the same seed (so the same inputs),
    the same limits, as ``mha-course grade`` takes them, and the chapters
    graded (``batch --chapter``), in course order."""

    seed: int
    check_seconds: float = 10.0
    chapters: tuple[Chapter, ...] = CHAPTERS


def grade_student(entry: Entry, options: GradingOptions) -> StudentGrade:
    """Grade one entry; never raises for anything the submission holds.

    Runs in a worker process of the batch's pool; the student's code runs in
    processes ``grade()`` forks from it, as for ``mha-course grade``.
    """
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="mha-batch-") as scratch:
            grade = _grade_entry(entry, Path(scratch), options)
    except Exception as error:  # a bug of the grader: one row says so, the batch goes on
        grade = ungraded(entry, f"the grader failed on this submission ({type(error).__name__}: "
                                 f"{error}); please report it", options.chapters)
    grade.seconds = round(time.perf_counter() - started, 3)
    return grade


def _grade_entry(entry: Entry, scratch: Path, options: GradingOptions) -> StudentGrade:
    from grader.grading import GraderError, grade
    from grader.loading import SubmissionError, load_submission
    from grader.report import results_json
    from grader.sandbox import Limits

    try:
        targets, found = submission_targets(entry.paths, scratch, options.chapters)
    except Unusable as error:
        return ungraded(entry, str(error), options.chapters)
    # A file the loader cannot read (not UTF-8, a notebook that is not JSON)
    # is left out with its reason; the student's other chapters are graded.
    readable, problems = [], {}
    for chapter, path in targets:
        try:
            load_submission(path, chapter.module)
            readable.append((chapter, path))
        except SubmissionError as error:
            problems[chapter.id] = f"{chapter.id} not graded: {error}"
    note = "; ".join(problems.values())
    if not readable:
        return ungraded(entry, note, options.chapters)
    limits = Limits.per_check(options.check_seconds)
    try:
        report = grade(readable, limits=limits, seed=options.seed)
    except GraderError as error:
        return ungraded(entry, f"the checks could not run: {str(error).splitlines()[0]}", options.chapters)
    graded = [chapter.id for chapter, _ in readable]
    sources = found.sources()
    report.sources = {chapter_id: sources[chapter_id] for chapter_id in graded}  # as `grade` shows them
    if problems:
        report.notes["submission"] = list(problems.values())
    scores = dict.fromkeys(exercise_keys(options.chapters), 0)  # a chapter not graded scores 0
    scores.update({exercise_key(result.chapter, result.exercise.name): result.score
                   for result in report.exercises})
    files = {chapter_id: found.shown(found.chosen[chapter_id]) for chapter_id in graded}
    results = _results(results_json(report), problems, report.seed, files, options.chapters)
    return StudentGrade(entry.student, entry.digest, scores, graded, note, known_bugs_in(report),
                        seed=report.seed, results=results)


def _results(graded: dict, reasons: dict[str, str], seed: int | None, files: dict[str, str],
             chapters: tuple[Chapter, ...]) -> dict:
    """A student's results JSON, as the Gradescope autograder writes one:
    ``graded`` (``report.results_json`` of the chapters graded, whose output
    names each file and why that one) with every other exercise of
    ``chapters`` at 0 points, saying why (``reasons`` by chapter id, else
    that the chapter has no file), and ``extra_data``: the seed and, by
    chapter id, the file graded."""
    results = with_missing_chapters(graded, chapters, reasons)
    results["extra_data"] = {"seed": seed, "files": files}
    return results


def ungraded(entry: Entry, reason: str, chapters: tuple[Chapter, ...]) -> StudentGrade:
    """The row of a submission that could not be graded: 0 points, the reason."""
    graded = {"output": f"submission: {reason}", "execution_time": 0.0, "tests": []}
    reasons = {chapter.id: f"not graded: {reason}" for chapter in chapters}
    return StudentGrade(entry.student, entry.digest, dict.fromkeys(exercise_keys(chapters), 0), [], reason,
                        results=_results(graded, reasons, None, {}, chapters))


def known_bugs_in(report) -> list[tuple[str, str, str]]:
    """``(chapter id, exercise, bug name)`` of each catalog bug a report's
    failed checks name by their hint, each once, in catalog order.

    A check's hint is the text of the known bug its value matched. Bugs may
    share a hint (one wording for the same slip in two functions), so the
    bug of the check's own exercise is preferred; a later exercise that
    calls a buggy earlier one (self-attention calling a scaled-dot-product
    without 1/sqrt(d)) names the earlier one's bug, counted once.
    """
    from grader.known_bugs import KNOWN_BUGS

    found: set[tuple[str, str, str]] = set()
    for result in report.exercises:
        for check in result.failed_checks:
            if not check.hint:
                continue
            matches = [bug for bug in KNOWN_BUGS.get(check.chapter, ()) if bug.hint == check.hint]
            if matches:
                bug = next((bug for bug in matches if bug.exercise == check.exercise), matches[0])
                found.add((check.chapter, bug.exercise, bug.name))
    order = {(chapter, bug.exercise, bug.name): index
             for chapter, bugs in KNOWN_BUGS.items() for index, bug in enumerate(bugs)}
    return sorted(found, key=lambda key: (key[0], order.get(key, 0)))


# -- the batch ------------------------------------------------------------------------


def run_batch(
    submissions: Path,
    out: Path,
    options: GradingOptions,
    jobs: int = 1,
    force: bool = False,
    progress: Callable[[int, int, int], None] | None = None,
    elsewhere: Callable[..., str] | None = None,
) -> BatchResult:
    """Grade every student of ``submissions`` whose entry changed; write the
    CSV, the results JSON of each student graded and the state.

    Args:
        submissions: the folder with one entry per student.
        out: where the grades go (created if need be): a new folder, or the
            one of an earlier batch of this class and these chapters.
        options: seed, limits and chapters, the same for every student.
        jobs: processes grading students side by side.
        force: grade every student, changed or not.
        progress: called with ``(students done, students to grade, could
            not be graded)`` as students finish.
        elsewhere: where the students are graded instead of here, as
            ``elsewhere(pending entries, options, done, fingerprint)``, which
            calls ``done`` as ``grade_each`` does and returns what its
            sandbox lacks: a Dask cluster's workers
            (``cluster.on_cluster(ADDRESS)``); ``jobs`` is then its to decide.

    Raises:
        OutFolderTaken: ``out`` holds grades of another class or other
            chapters, or files no batch recorded; nothing was written.
        cluster.ClusterError: from ``elsewhere``, which cannot grade
            (unreachable, no workers, another version of the course on a
            worker); what was graded by then is kept, and not graded again.
    """

    owner = Owner.of(submissions, options.chapters)
    claim(out, owner)
    out.mkdir(parents=True, exist_ok=True)
    # Apart: what it reads must not be in the memory students' workers are forked from
    # (graded elsewhere, none is forked from here).
    fingerprint = grader_fingerprint() if elsewhere is not None else computed_apart(grader_fingerprint)
    previous, checks_changed = ({}, False) if force else load_state(out, fingerprint, owner)
    entries = list_entries(submissions, leave_out=out)
    grades = {entry.student: previous[entry.student] for entry in entries
              if entry.student in previous and previous[entry.student].digest == entry.digest
              and results_intact(out, previous[entry.student])}
    pending = sorted((entry for entry in entries if entry.student not in grades),
                     key=lambda entry: -entry.size)  # the largest first: the batch ends sooner
    retry: dict[str, StudentGrade] = {}
    broken = 0
    # The folder is this class's from now on, before any of its results is
    # written: a run cut short (killed) is still recognised as its own.
    save_state(out, fingerprint, owner, grades)
    (out / RESULTS_FOLDER).mkdir(exist_ok=True)
    if progress:
        progress(0, len(pending), 0)
    if len(pending) > 1 and elsewhere is None:  # imported once here, not once per student
        from grader.sandbox import preload

        preload(options.chapters)

    def done(entry: Entry, grade: StudentGrade | None,
             stopped: str = "the grader's process stopped while grading this submission") -> None:
        nonlocal broken
        if grade is None:  # the grading process itself died (killed, out of memory), or the cluster's did
            grade = ungraded(entry, f"{stopped}; run the batch again", options.chapters)
            retry[entry.student] = grade  # in the CSV, not in the state: graded again next run
        else:
            grades[grade.student] = grade
        text = json.dumps(grade.results, indent=2)
        write_atomically(results_path(out, grade.student), text)
        grade.results, grade.results_digest = None, sha256_text(text)
        broken += bool(grade.note)
        if progress:
            progress(len(grades) + len(retry) - kept, len(pending), broken)

    kept = len(grades)
    try:
        if elsewhere is not None:  # no clean parent here: each worker's grading service has its own
            unprotected = elsewhere(pending, options, done, fingerprint)
        else:
            from grader.sandbox import layers

            _grade_here(pending, options, jobs, done)
            unprotected = isolation.missing(layers())
    finally:
        # Even when interrupted: what was graded is kept, and not graded again.
        save_state(out, fingerprint, owner, grades)
    rows = [grades.get(entry.student) or retry[entry.student] for entry in entries]
    write_csv(out / CSV_FILE, rows, options.chapters)
    return BatchResult(rows, {entry.student for entry in pending}, checks_changed, out, options.seed,
                       unprotected, options.chapters)


def _grade_here(pending: list[Entry], options: GradingOptions, jobs: int,
                done: Callable[[Entry, StudentGrade | None], None]) -> None:
    """Grade ``pending`` on this machine, in processes forked from this one
    (``grade_each``), ``jobs`` at a time."""
    from grader.sandbox import clean_parent

    with clean_parent():  # after torch and the preloads, before any student's grade reads a check
        if len(pending) > 1:  # collected once here, not once per student (its parent forked)
            from grader.check_runner import collected

            for chapter in options.chapters:
                collected(chapter)
        grade_each(pending, options, max(1, jobs), done)


def computed_apart(function: Callable[[], str]) -> str:
    """``function()``, computed in a forked child: what it reads (the
    reference solutions) never enters this process's memory, from which
    every student's workers are forked."""
    from grader.side_by_side import fork_answering

    pid, read_fd = fork_answering(function)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


def student_seconds(options: GradingOptions) -> float:
    """How long one student's grade may take, whatever the submission does:
    every exercise's limit, every chapter's file loaded a few times (a line
    that hangs is skipped and the file run again), and a margin. Past it,
    the student's grading is stopped and the batch goes on."""
    limits = Limits.per_check(options.check_seconds)
    exercises = sum(len(chapter.exercises) for chapter in options.chapters)
    return exercises * limits.exercise_seconds + len(options.chapters) * 4 * limits.check_seconds + 30


def grade_each(entries: list[Entry], options: GradingOptions, jobs: int,
               done: Callable[[Entry, StudentGrade | None], None]) -> None:
    """Grade each entry in a process of its own, forked from this one, ``jobs``
    at a time, and call ``done(entry, grade)`` as each ends (``grade`` None:
    the process died).

    Each student's grading starts from this process, so nothing of another
    student's run is in its memory. No worker comes from it: their fork
    servers come from the clean parent (``sandbox.clean_parent``), forked
    before ``batch`` collects the checks here (once for every student). A
    student whose grading does not end within ``student_seconds`` is
    stopped, with everything it started, and gets a row that says so.
    """
    limit = student_seconds(options)
    queue = list(entries)
    running: dict[int, _Grading] = {}  # by the descriptor its answer arrives on
    reaping.adopt_orphans()
    try:
        while queue or running:
            while queue and len(running) < jobs:
                grading = _Grading.start(queue.pop(0), options, limit)
                running[grading.read_fd] = grading
            wait = max(0.0, min(grading.deadline for grading in running.values()) - time.monotonic())
            ready, _, _ = select.select(list(running), [], [], wait)
            for fd in ready:
                grading = running[fd]
                if grading.read():
                    continue
                del running[fd]
                done(grading.entry, grading.finish())
            for fd, grading in list(running.items()):
                if time.monotonic() > grading.deadline:
                    del running[fd]
                    grading.stop()
                    done(grading.entry, ungraded(grading.entry, f"grading did not end within {limit:g} s "
                                                  "and was stopped (a submission that hangs the grader?)",
                                                  options.chapters))
    finally:
        for grading in running.values():  # interrupted: nothing is left running
            grading.stop()


@dataclass
class _Grading:
    """One student's grading, in a child process; its answer comes through a pipe."""

    entry: Entry
    pid: int
    read_fd: int
    deadline: float
    chunks: list[bytes] = field(default_factory=list)

    @classmethod
    def start(cls, entry: Entry, options: GradingOptions, seconds: float) -> _Grading:
        from grader.side_by_side import fork_answering

        def compute() -> StudentGrade:
            import torch

            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the batch's to handle
            # Forked, it has none of OpenMP's threads, and would hang waiting on them.
            torch.set_num_threads(1)
            return grade_student(entry, options)

        pid, read_fd = fork_answering(compute)
        return cls(entry, pid, read_fd, time.monotonic() + seconds)

    def read(self) -> bool:
        """Read what has arrived; False at the end of the answer."""
        chunk = os.read(self.read_fd, 2**20)
        self.chunks.append(chunk)
        return bool(chunk)

    def finish(self) -> StudentGrade | None:
        """The grade the child sent (pickled by grader code: student code
        runs in its workers, whose inherited descriptors point nowhere), or
        None when it died first."""
        self.stop()
        data = b"".join(self.chunks)
        return pickle.loads(data) if data else None

    def stop(self) -> None:
        """End the child and everything below it, the fork servers the clean
        parent forked for it included; safe to call twice."""
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1
            reaping.stop_tree(self.pid)
            forkserver.stop_servers_of(self.pid)


def write_csv(path: Path, rows: list[StudentGrade], chapters: tuple[Chapter, ...] = CHAPTERS) -> None:
    """``student``, a column per exercise of ``chapters`` (``ch01/softmax``),
    ``total`` (over those exercises), ``note``."""
    keys = exercise_keys(chapters)
    with open(path.with_name(f".{path.name}.partial"), "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(["student", *keys, "total", "note"])
        for row in rows:
            scores = [row.scores.get(key, 0) for key in keys]
            writer.writerow([row.student, *scores, sum(scores), row.note])
    path.with_name(f".{path.name}.partial").replace(path)


# -- the summary ------------------------------------------------------------------------


def print_summary(result: BatchResult, console: Console, top_bugs: int = 10) -> None:
    """The class at a glance: per exercise how many submitted it and passed;
    the catalog's known bugs by how many students made them; who could not
    be graded and why; where the files are. Fits 80 columns (a pipe, a log)."""
    rows = result.grades
    if result.unprotected:  # first: an instructor must know what the class's code could reach
        console.print(Text(f"warning: {result.unprotected}", style="bold yellow"))
    table = Table(title=f"mha-course batch · {len(rows)} students", title_justify="left",
                  title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("exercise", no_wrap=True)
    for name in ("points", "submitted", "passed", "rate"):  # rate: passed / submitted the chapter
        table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    for chapter in result.chapters:
        submitted = [row for row in rows if chapter.id in row.graded]
        if not submitted:
            continue
        table.add_row(Text(chapter.id, style="bold"))
        for exercise in chapter.exercises:
            if exercise.optional:  # worth 0 points: a score cannot tell written and right from left alone
                continue
            key = exercise_key(chapter, exercise.name)
            passed = sum(row.scores.get(key, 0) == exercise.points for row in submitted)
            rate = passed / len(submitted)
            table.add_row(exercise.name, str(exercise.points), str(len(submitted)), str(passed),
                          Text(f"{rate:.0%}", style="green" if rate >= 0.8 else "red" if rate < 0.5 else ""))
    if table.row_count:
        console.print(table)
    _print_bugs(rows, console, top_bugs)
    unusable = [row for row in rows if row.note]
    for row in unusable:
        # Text, not markup: a reason may quote a file name with "[...]" in it.
        console.print(Text(f"✗ {row.student}: {row.note}", style="yellow"))
    if result.checks_changed:
        console.print(Text("the checks, the known bugs or the solutions changed since the last run: "
                           "every student was graded again", style="yellow"))
    mean = sum(row.total for row in rows) / len(rows) if rows else 0.0
    kept = len(rows) - len(result.graded_now)
    console.print(Text(f"{len(result.graded_now)} graded, {kept} unchanged (kept; --force regrades), "
                       f"{len(unusable)} with a note", style="bold"))
    points = sum(chapter.points for chapter in result.chapters)
    graded = "" if result.chapters == CHAPTERS else f" ({', '.join(chapter.id for chapter in result.chapters)})"
    console.print(Text(f"class mean {mean:.1f} / {points} points{graded}", style="bold"))
    console.print(Text(f"wrote {result.out / CSV_FILE} and {result.out / RESULTS_FOLDER}/STUDENT.json "
                       f"({seeds_used(result)})", style="dim"))


def seeds_used(result: BatchResult) -> str:
    """The seed(s) the class's rows were graded with, for the summary: this
    run's seed names only the rows graded now, and a re-run that graded
    nobody again printing it would pass off the kept rows as graded with it."""
    kept = sorted({row.seed for row in result.grades
                   if row.student not in result.graded_now and row.seed is not None})
    kept_seeds = f"seed{'s' if len(kept) > 1 else ''} {', '.join(map(str, kept))}"
    if not result.graded_now:
        return f"nothing graded again: results kept, graded with {kept_seeds}" if kept else "nothing graded"
    if not kept or kept == [result.seed]:
        return f"seed {result.seed}"
    return f"seed {result.seed}; the results kept were graded with {kept_seeds}"


def _print_bugs(rows: list[StudentGrade], console: Console, top: int) -> None:
    """The known bugs most students made, as the catalog names them, each
    with its hint below it."""
    from grader.known_bugs import KNOWN_BUGS

    counts = Counter(bug for row in rows for bug in set(map(tuple, row.bugs)))
    if not counts:
        return
    hints = {(chapter, bug.exercise, bug.name): bug.hint for chapter, bugs in KNOWN_BUGS.items() for bug in bugs}
    table = Table(title="most frequent known bugs", title_justify="left", title_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("students", justify="right", no_wrap=True)
    table.add_column("known bug (exercise: name) and its hint", ratio=1)
    # Most students first; a tie in catalog order, as the CSV's columns.
    ranked = sorted(counts.items(), key=lambda item: -item[1])[:top]
    for (chapter, exercise, name), count in ranked:
        table.add_row(str(count), Text.assemble((f"{chapter} {exercise}: {name}", "bold"), "\n",
                                                (hints.get((chapter, exercise, name), ""), "dim")))
    console.print(table)
