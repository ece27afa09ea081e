"""Grade submissions: parse them, run the hidden checks, sum up the verdicts.

``grade`` is what ``mha-course grade`` calls, and what the other front ends
(batch grading, Gradescope, the notebook's ``check()``) call too. It runs
each chapter's checks (``grader.check_runner``: pytest collects them once
per process, the grader calls them), chapters side by side in forked copies
of this process (``grader.side_by_side``); student code runs only
in the workers that ``RemoteSubmission`` has forked, and nothing they start
outlives the grade (``grader.reaping``).

The workers' fork servers come from the clean parent that the command
started before it read anything secret (``sandbox.clean_parent``), never
from this process, which reads the checks, the reference and the known
bugs. Called without one (as a library, by the tests), a grade forks them
from the calling process, which then must hold nothing secret itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import re
import secrets
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grader import forkserver, reaping, recorded, static_scan
from grader.catalog import META_RUN_PRELOAD, Chapter, Exercise
from grader.check_runner import ChapterRun, CheckResult, CollectionError
from grader.forkserver import ForkServer, ForkServerError
from grader.loading import Submission, SubmissionError, load_submission
from grader.outcomes import Failure, Status
from grader.remote_submission import Printed, RemoteSubmission
from grader.sandbox import Limits, fork_server, preload  # noqa: F401 - preload: for callers that grade
from grader.side_by_side import ForkedCopyDied, one_thread, run_side_by_side


class GraderError(RuntimeError):
    """The grader could not run its checks (a bug of the course, not the student)."""


class UnrecordedSeed(GraderError, ValueError):
    """``--seed`` names a seed the student edition has no recordings for."""


@dataclass
class ExerciseResult:
    """The verdict on one exercise: every check passed, or why not."""

    chapter: Chapter
    exercise: Exercise
    status: Status
    reason: str  # one line for a table
    checks: list[CheckResult]
    note: str = ""  # e.g. that an exercise it builds on fails too; never a point

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # its word will do: "passed" is Status.PASSED

    @property
    def score(self) -> int:
        return self.exercise.points if self.status == Status.PASSED else 0

    @property
    def failed_checks(self) -> list[CheckResult]:
        return [check for check in self.checks if check.outcome == "failed"]


@dataclass
class GradeReport:
    """Everything one ``grade`` run found."""

    exercises: list[ExerciseResult]
    notes: dict[str, list[str]] = field(default_factory=dict)  # by chapter id
    seconds: float = 0.0
    seed: int = 0
    device: str = "cpu"
    sources: dict[str, str] = field(default_factory=dict)  # by chapter id: the file graded, and why
    # By chapter id: what kept the whole file from being graded (unreadable,
    # empty, a notebook that is not JSON): said once, not once per exercise.
    problems: dict[str, str] = field(default_factory=dict)
    # By chapter id, then remote_submission.TOP_LEVEL or exercise: what the student's
    # code printed. Data from the workers, shown on request, never graded.
    printed: dict[str, dict[str, Printed]] = field(default_factory=dict)

    @property
    def score(self) -> int:
        return sum(result.score for result in self.exercises)

    @property
    def max_score(self) -> int:
        return sum(result.exercise.points for result in self.exercises)

    @property
    def passed(self) -> bool:
        return all(result.status.counts_as_passed for result in self.exercises)


def grade(
    targets: list[tuple[Chapter, Path]],
    device: torch.device = torch.device("cpu"),
    limits: Limits = Limits(),
    seed: int | None = None,
    only: set[str] | None = None,
    jobs: int = 1,
    mode: recorded.Mode | None = None,
    account: tuple[int, int] | None = None,
) -> GradeReport:
    """Grade one file per chapter.

    Args:
        targets: ``(chapter, path of the student's file)`` pairs.
        device: where the student's code runs.
        limits: time and memory limits for student code.
        seed: seed of the random inputs; a fresh one when None.
        only: names of the exercises to check; the report holds just those.
            None checks every exercise.
        jobs: processes that check chapters side by side (``grader.side_by_side``):
            ``side_by_side.default_processes()`` for a student's grade; 1 where the
            caller already grades several submissions side by side.
        mode: how the reference, the known bugs and the oracles answer
            (``recorded.Mode``); None: as this tree does (``recorded.tree_mode``).
        account: the ``(uid, gid)`` the workers run as (``sandbox.fork_server``);
            None: the account of this process.
    """
    started = time.perf_counter()
    mode = mode if mode is not None else recorded.tree_mode()
    run = _Run(_limits_on(device, limits), device, _seed(seed, mode), only, mode, account)
    with _tuned_for_grading():
        parsed = _parse(targets)
        found = _check_chapters([chapter for chapter, _ in targets], parsed, run, jobs)
    checked = {found_here.chapter: found_here for found_here in found}
    results = [result for found_here in found for result in found_here.results]
    exercises = [verdict for chapter, _ in targets
                 for verdict in _sum_up(chapter, results, only,
                                        _source_notes(chapter, parsed[chapter.id], only))]
    report = GradeReport(exercises, seconds=time.perf_counter() - started, seed=run.seed, device=str(device))
    for chapter, path in targets:
        rows = [result for result in exercises if result.chapter is chapter]
        if notes := _unsaid(checked[chapter.id].notes, rows):
            report.notes[chapter.id] = notes
        if problem := _file_problem(path, parsed[chapter.id], checked[chapter.id].results):
            report.problems[chapter.id] = problem
        if checked[chapter.id].printed:
            report.printed[chapter.id] = checked[chapter.id].printed
    return report


@dataclass
class _Checked:
    """What one chapter's checks found: every check's result, the notes on
    the file (statements skipped, syntax repaired), and what the student's
    code printed, by ``remote_submission.TOP_LEVEL`` or exercise."""

    chapter: str
    results: list[CheckResult]
    notes: list[str]
    printed: dict[str, Printed]


@dataclass(frozen=True)
class _Run:
    """What every chapter of one grading run is checked with."""

    limits: Limits
    device: torch.device
    seed: int
    only: set[str] | None
    mode: recorded.Mode
    account: tuple[int, int] | None


# -- the steps of a grade, in order -------------------------------------------------


def _seed(seed: int | None, mode: recorded.Mode) -> int:
    """The seed of the run's inputs: the one asked for, else a fresh one.
    The student edition grades with recorded seeds only."""
    try:
        seed = mode.seed(seed)
    except ValueError as error:
        raise UnrecordedSeed(str(error)) from None
    return secrets.randbelow(2**31) if seed is None else seed


def _limits_on(device: torch.device, limits: Limits) -> Limits:
    """The limits as they apply on ``device``: CUDA reserves far more address
    space than it uses, so there the memory limit is off."""
    return dataclasses.replace(limits, memory_bytes=0) if device.type == "cuda" else limits


def _parse(targets: list[tuple[Chapter, Path]]) -> dict[str, Submission | SubmissionError]:
    """Each chapter's file, parsed but not run (``grader.loading``), or why it
    could not be: by chapter id."""
    parsed: dict[str, Submission | SubmissionError] = {}
    for chapter, path in targets:
        try:
            parsed[chapter.id] = load_submission(path, chapter.module)
        except SubmissionError as error:
            parsed[chapter.id] = error
    return parsed


def _check_chapters(chapters: list[Chapter], parsed: dict[str, Submission | SubmissionError], run: _Run,
                    jobs: int) -> list[_Checked]:
    """Run every chapter's checks, ``jobs`` processes side by side, and stop
    whatever they started before returning: what each chapter's found."""
    runnable = {key: value for key, value in parsed.items() if isinstance(value, Submission)}

    def server() -> contextlib.closing[_Forks]:
        # One per process, asked for when it takes its first chapter: every
        # worker is forked from it, none from a process that runs checks.
        return contextlib.closing(_Forks(fork_server(runnable, run.account)))

    def check(chapter: Chapter, forks: _Forks):
        return _check_chapter(chapter, parsed[chapter.id], run, forks)

    # Heaviest first, so that no process is left with a long chapter at the
    # end. Recording a student edition keeps what it records in this process.
    chapters = sorted(chapters, key=_grading_cost, reverse=True)
    recording = isinstance(run.mode, recorded.Recorder)
    # Whatever the grade starts is stopped before its report exists: the
    # processes that were here before it are not its own.
    reaping.adopt_orphans()
    before = reaping.descendants()
    try:
        return run_side_by_side(chapters, check, 1 if recording else jobs, server)
    except (ForkedCopyDied, ForkServerError) as error:  # a fork server could not be had, here or in a copy
        raise GraderError(str(error)) from None
    finally:
        reaping.stop_descendants(spare=before)


def _file_problem(path: Path, parsed: Submission | SubmissionError, results: list[CheckResult]) -> str:
    """What kept the whole file from being graded, or "": it could not be
    read or parsed, it could not be run (every check of its chapter, in
    ``results``, says so, as ``Failure.UNREADABLE``), or it holds no code."""
    if isinstance(parsed, SubmissionError):
        return str(parsed)
    unreadable = next((r.message for r in results if r.kind == Failure.UNREADABLE), "")
    if unreadable:
        return unreadable
    if not parsed.statements and not parsed.problems:
        return f"{path.name} is empty: there is no code to grade" if not parsed.source.strip() else \
            f"{path.name} holds no code, only comments: there is nothing to grade"
    return ""


def _unsaid(notes: list[str], exercises: list[ExerciseResult]) -> list[str]:
    """The notes on a chapter's file, less those one of its ``exercises``
    says already in its reason (a syntax error in softmax is softmax's)."""
    return [note for note in notes if not any(result.reason.startswith(note) for result in exercises)]


def _source_notes(chapter: Chapter, parsed: Submission | SubmissionError,
                  only: set[str] | None) -> dict[str, str]:
    """What the static scan notes on the chapter's exercises (a forbidden
    call in their source), by exercise: a note, never a point."""
    return static_scan.notes(chapter, parsed, only) if isinstance(parsed, Submission) else {}


def _sum_up(chapter: Chapter, results: list[CheckResult], only: set[str] | None,
            source_notes: dict[str, str]) -> list[ExerciseResult]:
    """The verdict on each of the chapter's exercises that was checked, in
    catalog order (an exercise's note may name an earlier one that fails),
    with what ``source_notes`` says of it added to its note, unless a check
    already failed on a refused call: its message names the call and the line."""
    verdicts: dict[str, ExerciseResult] = {}
    for exercise in chapter.exercises:
        if only is not None and exercise.name not in only:
            continue
        checks = [r for r in results if r.chapter == chapter.id and r.exercise == exercise.name]
        verdict = _verdict(chapter, exercise, checks, verdicts)
        refused = any(check.kind == Failure.FORBIDDEN for check in verdict.failed_checks)
        if exercise.name in source_notes and not refused:
            verdict.note = "; ".join(filter(None, (verdict.note, source_notes[exercise.name])))
        verdicts[exercise.name] = verdict
    return list(verdicts.values())


# -- process-wide settings --------------------------------------------------------------


@contextlib.contextmanager
def _tuned_for_grading() -> Iterator[None]:
    """What a grade sets for the whole process, in one place: torch computes
    on one thread (``side_by_side.one_thread`` says why), and the objects alive
    before the first grade are frozen out of the garbage collector's reach
    (``_freeze_what_lives_on``)."""
    _freeze_what_lives_on()
    with one_thread():
        yield


_frozen = False  # a process forked after the freeze inherits both


def _freeze_what_lives_on() -> None:
    """What is alive now (torch, pytest) lives to the end: garbage
    collections during the checks need not walk its objects again and again.

    Once per process: a later freeze would keep the garbage of earlier
    grades (a batch grades many students in each process) forever. A flag
    says whether it was done, not ``gc.get_freeze_count()``, which walks
    every frozen object to count them.
    """
    global _frozen
    if not _frozen:
        gc.freeze()
        _frozen = True


class _Forks:
    """What one grading process forks its workers from: its fork server,
    and the copies of it that have imported more (``ForkServer.preloaded_copy``),
    each made when a chapter first needs it and kept for the next ones."""

    def __init__(self, server: ForkServer):
        self.server = server
        self._copies: list[tuple[frozenset[str], ForkServer]] = []

    def copy_with(self, modules: Iterable[str]) -> ForkServer:
        """A copy that has imported ``modules`` (or more)."""
        wanted = frozenset(modules)
        for imported, copy in self._copies:
            if wanted <= imported:
                return copy
        copy = self.server.preloaded_copy(sorted(wanted))
        self._copies.append((wanted, copy))
        return copy

    def close(self) -> None:
        for _, copy in self._copies:
            copy.close()
        self.server.close()


def _check_chapter(chapter: Chapter, parsed: Submission | SubmissionError, run: _Run,
                   forks: _Forks) -> _Checked:
    """Run one chapter's checks, with workers from ``forks``: what they found."""
    preloaded = _preloaded_copy(chapter, parsed, run, forks)
    remote = RemoteSubmission(chapter, parsed, run.limits, run.device, forks.server, preloaded)
    checks = ChapterRun(remote, run.seed, run.mode, run.only)
    try:
        checks.run()
    except CollectionError as error:
        raise GraderError(str(error)) from None
    finally:
        remote.close()
    printed = {where: text for where, text in remote.printed.items() if text}
    return _Checked(chapter.id, checks.results, remote.notes, printed)


def _preloaded_copy(chapter: Chapter, parsed: Submission | SubmissionError, run: _Run,
                    forks: _Forks) -> ForkServer | None:
    """A copy of the fork server that imports, while the other checks run,
    what the chapter's exercises preload (``Exercise.preload``) and what its
    portability check's meta runs need (``META_RUN_PRELOAD``: ``check_runner`` runs
    that check last); or None where there is nothing to import: the server
    has it already (a batch, ``verify`` and ``watch`` import it before they
    fork the clean parent or the server: ``sandbox.preload``; a grade in
    several processes has its clean parent import it: ``sandbox.clean_parent``)."""
    if not isinstance(parsed, Submission):
        return None
    wanted = [exercise for exercise in chapter.exercises if run.only is None or exercise.name in run.only]
    try:
        origin = forkserver.servers_origin()
    except ForkServerError:  # its workers come from the server, which imports nothing more
        return None
    imported = origin.modules if origin is not None else sys.modules
    needed = (*META_RUN_PRELOAD, *(name for exercise in wanted for name in exercise.preload))
    missing = [name for name in dict.fromkeys(needed) if name not in imported]
    if not missing:
        return None
    try:
        return forks.copy_with(missing)
    except ForkServerError:  # its workers come from the server, which imports nothing more
        return None


def _grading_cost(chapter: Chapter) -> int:
    """How many check functions the chapter has, plus what its catalog entry
    adds for slow ones (``Chapter.extra_cost``): a measure of its grading time.
    (It reads the checks: a fork server forked from this process after it
    would hold their text, which is why none is, under a clean parent.)"""
    checks = chapter.checks.read_text(encoding="utf-8").count("\ndef test_")
    return checks + chapter.extra_cost


def _in_few_words(message: str, width: int = 90) -> str:
    """A check's sentence for a table cell: its first call named without
    its arguments (``causal_mask(4, 6) lets ...`` -> ``causal_mask lets ...``),
    cut at a word near ``width``."""
    call = re.search(r"[A-Za-z_][\w.]*\(", message)
    if call is not None:
        depth, end = 0, call.end() - 1
        for end in range(call.end() - 1, len(message)):
            depth += {"(": 1, ")": -1}.get(message[end], 0)
            if depth == 0:
                break
        if depth == 0:
            message = message[:call.end() - 1] + message[end + 1:]
    if len(message) <= width:
        return message
    cut = message.rfind(" ", width // 2, width)
    return message[:cut if cut > 0 else width].rstrip(" ,;:(") + " ..."


def _verdict(chapter: Chapter, exercise: Exercise, checks: list[CheckResult],
             earlier: dict[str, ExerciseResult]) -> ExerciseResult:
    """Sum up an exercise's checks: all pass, or the first failure's sentence."""
    ran = [check for check in checks if check.outcome != "skipped"]
    if not ran:
        return ExerciseResult(chapter, exercise, Status.FAILED, "no check ran (a grader problem)", checks)
    failed = [check for check in checks if check.outcome == "failed"]
    noted = "; ".join(dict.fromkeys(check.note for check in ran
                                    if check.note and not (failed and check.moot_if_failed)))
    if not failed:
        return ExerciseResult(chapter, exercise, Status.PASSED, f"{len(ran)} checks passed", checks, noted)
    kinds = {check.kind for check in failed}
    first = failed[0]
    untouched = kinds == {Failure.NOT_IMPLEMENTED} and len(failed) == len(ran)
    if exercise.optional and (untouched or first.kind == Failure.MISSING):
        return ExerciseResult(chapter, exercise, Status.NOT_ATTEMPTED,
                              "optional, no points: graded when you write it", checks)
    if untouched:
        return ExerciseResult(chapter, exercise, Status.NOT_IMPLEMENTED, "not implemented yet", checks)
    if first.kind == Failure.MISSING:
        return ExerciseResult(chapter, exercise, Status.MISSING, first.message, checks)
    # One line: a known bug's hint says most, then a relation's (of any
    # failed check: ``check_runner`` leaves none beside a known bug's); a wrong
    # value is summed up by the check's name and what differed (the sentence
    # follows the table); anything else by its message.
    related = next((check for check in failed if check.relation), None)
    if first.hint or first.kind != Failure.MISMATCH:
        summary = first.hint or first.message
    elif related is not None:
        summary = related.hint
    else:
        summary = f'fails "{first.check}": {first.summary or _in_few_words(first.message)}'
    reason = f"{summary} ({len(failed)} of {len(ran)} checks failed)"
    # Only what the failing checks ran: a failure elsewhere says nothing of this one.
    reached = {name for check in failed for name in check.reached}
    failing_uses = [name for name in exercise.uses if name in reached
                    and name in earlier and earlier[name].status != Status.PASSED]
    note = f"it uses {', '.join(failing_uses)}, which fails too" if failing_uses else ""
    return ExerciseResult(chapter, exercise, Status.FAILED, reason, checks, "; ".join(filter(None, (note, noted))))
