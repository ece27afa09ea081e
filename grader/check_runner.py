"""Run one chapter's hidden checks and collect their verdicts.

The checks in ``grader/chapters/chNN/`` are ordinary pytest tests. pytest
collects each chapter's file once per process (``collected``): it imports
the file, expands its parametrized checks and names each one (its id seeds
the check's inputs and keys its recorded answers). A grade then calls the
collected checks itself (``ChapterRun``), giving them their fixtures
(``submission``, ``reference``, ``bugs``, ``inputs``) and recording, for each
check, its exercise, its outcome and the one sentence a student reads. A
pytest session for each chapter of each grade cost a process that grades
many times (``watch``, ``batch``, ``verify``, the course's tests) about
0.2 s of CPU a chapter and grade, most of it collecting again; a single
``grade`` collects each chapter once either way. Nothing here trusts the
submission: its code runs in workers, and outcomes are recorded in this
process only.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import io
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from grader import recorded, relations
from grader.catalog import GRADING_DIR, Chapter
from grader.checks import Oracles
from grader.compare import CheckFailure, Noted
from grader.inputs import Inputs
from grader.known_bugs import KNOWN_BUGS
from grader.outcomes import Failure
from grader.remote_submission import RemoteSubmission


class CollectionError(RuntimeError):
    """pytest could not collect a chapter's checks (a bug of the course, not the student)."""


@dataclass
class CheckResult:
    """One check's verdict.

    ``outcome`` is "passed", "failed" or "skipped"; ``kind``, of a failed
    check, is the ``CheckFailure``'s, or ``GRADER_ERROR`` when the check
    itself broke.
    """

    chapter: str
    exercise: str
    check: str
    outcome: str
    message: str = ""
    kind: Failure | None = None
    hint: str | None = None
    relation: str | None = None  # where ``hint`` is a relation's (``grader.relations``), its names
    summary: str = ""  # a mismatch in a few words: where, how large
    details: str = ""  # a grader error's traceback, for --verbose
    reached: tuple[str, ...] = ()  # the exercises it builds on that the check's calls ran
    note: str = ""  # a passed check's note (``compare.note``): never a point
    moot_if_failed: bool = False  # the note is left out of a failed exercise's row


# -- collection: once per process and version of a chapter's file -------------------------


@dataclass(frozen=True)
class Check:
    """One collected check: a test function with one set of parameters."""

    id: str  # "test_ch01_self_attention.py::name[case]": seeds its inputs, keys its recordings
    exercise: str  # the catalog exercise it judges (its ``exercise`` marker)
    title: str  # the sentence a student reads (``check_title``)
    function: Callable
    arguments: tuple[str, ...]  # its parameters, in order: fixtures and parametrized values
    parameters: dict  # the parametrized values, by name
    last: bool  # a portability check: run after the chapter's others


def check_title(item: pytest.Item) -> str:
    """The sentence a check's docstring gives, with its parameters."""
    doc = (getattr(item, "function", None).__doc__ or "").strip().splitlines()
    title = doc[0].rstrip(".") if doc else item.originalname.removeprefix("test_").replace("_", " ")
    callspec = getattr(item, "callspec", None)
    return f"{title} [{callspec.id}]" if callspec else title


# By (path, modification time, size) of a chapter's check file: a file
# rewritten in place (a course's own tests do) is collected again.
_collected: dict[tuple[str, int, int], tuple[Check, ...]] = {}


def collected(chapter: Chapter) -> tuple[Check, ...]:
    """The chapter's checks in the order of its file, collected by pytest the
    first time this process asks (a process forked later inherits them)."""
    stat = chapter.checks.stat()
    key = (str(chapter.checks), stat.st_mtime_ns, stat.st_size)
    if key not in _collected:
        _collected[key] = _collect(chapter.checks)
    return _collected[key]


class _Collector:
    """The plugin that keeps what a collect-only session found."""

    def __init__(self):
        self.items: list[pytest.Item] = []

    def pytest_configure(self, config: pytest.Config) -> None:
        config.addinivalue_line("markers", "exercise(name): the catalog exercise a check judges")
        config.addinivalue_line("markers", "portability: a check run last in its chapter, on meta")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = list(session.items)


def _collect(path: Path) -> tuple[Check, ...]:
    arguments = [
        str(path),
        "--collect-only",
        "-c", str(GRADING_DIR / "pytest.ini"),  # never a config file of the submission's
        # Its own folder, so a check's id is "test_ch01_self_attention.py::name",
        # which seeds its inputs (``Inputs``) and keys its recorded answers.
        "--rootdir", str(path.parent),
        "--noconftest",  # a conftest.py next to a submission is never loaded
        "--import-mode=importlib",
        "--assert=plain",  # checks raise CheckFailure: rewriting their asserts is work for nothing
        # Plugins that collecting has no use for.
        *("-p", "no:cacheprovider", "-p", "no:stepwise", "-p", "no:unraisableexception",
          "-p", "no:threadexception", "-p", "no:faulthandler", "-p", "no:doctest",
          "-p", "no:junitxml", "-p", "no:pastebin", "-p", "no:logging"),
        "-q",
    ]
    collector = _Collector()
    output = io.StringIO()
    before = set(sys.modules)
    try:
        with _pytest_environment(), contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            code = pytest.main(arguments, plugins=[collector])
    finally:
        _forget_module_of(path, set(sys.modules) - before)
    if code == pytest.ExitCode.INTERRUPTED and "Interrupted: " not in output.getvalue():
        raise KeyboardInterrupt  # Ctrl-C: pytest caught it, the caller should too
    if code != pytest.ExitCode.OK:
        raise CollectionError(f"the checks could not be collected (pytest exit {int(code)}):\n"
                              f"{output.getvalue()}")
    return tuple(_check(item) for item in collector.items)


def _forget_module_of(path: Path, new: set[str]) -> None:
    """Take the module pytest imported from ``path`` (among the ``new`` names
    of ``sys.modules``) out of ``sys.modules``. pytest names it after the
    file alone (its folder is the root) and would hand it back for another
    file of that name, for this one rewritten, or, half made, after this one
    failed to import. The collected checks keep what they need of it."""
    for name in new:
        if getattr(sys.modules.get(name), "__file__", None) == str(path):
            del sys.modules[name]


def _check(item: pytest.Item) -> Check:
    callspec = getattr(item, "callspec", None)
    parameters = dict(callspec.params) if callspec else {}
    return Check(item.nodeid, _exercise_of(item), check_title(item), item.function,
                 _arguments(item.function, parameters), parameters,
                 item.get_closest_marker("portability") is not None)


def _arguments(function: Callable, parameters: dict) -> tuple[str, ...]:
    """What a check is called with, as pytest calls it: its named parameters,
    less those with a default that no parametrization sets."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(name for name, parameter in inspect.signature(function).parameters.items()
                 if parameter.kind in named
                 and (parameter.default is inspect.Parameter.empty or name in parameters))


def _exercise_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("exercise")
    if marker is None or not marker.args:
        raise CollectionError(f"check {item.nodeid} has no @exercise marker")
    return marker.args[0]


MISSED_EDITS = 1  # checks of an exercise that ran the edits of the reference and matched none, before they stop
# What pytest reads from the environment, as the collecting session has it:
# no installed plugin, and none of the caller's options or plugins (a
# PYTEST_ADDOPTS set for the course's own test suite, say). None: unset.
PYTEST_ENVIRONMENT = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": None, "PYTEST_PLUGINS": None}


@contextlib.contextmanager
def _pytest_environment() -> Iterator[None]:
    """``PYTEST_ENVIRONMENT`` in ``os.environ`` while pytest collects; the
    caller's values again after."""
    previous = {name: os.environ.get(name) for name in PYTEST_ENVIRONMENT}

    def put(values: dict[str, str | None]) -> None:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    put(PYTEST_ENVIRONMENT)
    try:
        yield
    finally:
        put(previous)


# -- a run: every check of one chapter, once --------------------------------------------


class ChapterRun:
    """Fixtures and verdicts for the checks of one chapter.

    Args:
        submission: the chapter's submission, as the checks call it.
        seed: the run's seed for random inputs.
        mode: how the reference, the known bugs and the oracles answer
            (``recorded.Mode``): live, recorded, or replayed.
        only: names of the exercises whose checks run; None runs them all.
    """

    def __init__(self, submission: RemoteSubmission, seed: int, mode: recorded.Mode,
                 only: set[str] | None = None):
        self.chapter = submission.chapter
        self.remote = submission
        if isinstance(mode, recorded.Recorder):  # what the edits raise on each call's inputs is recorded too
            submission.on_call = functools.partial(mode.submitted, submission.chapter)
        self.seed = seed
        self.mode = mode
        self.only = only
        self.results: list[CheckResult] = []
        self._reference: object | None = None
        self._hints_seen = relations.Seen()  # what the failed checks so far matched, first first
        # The relations each mismatch holds, and whether the edits of the reference were tried on it.
        self._examined: list[tuple[CheckResult, list[relations.Found], bool]] = []
        self._edits_missed: dict[str, int] = {}  # an exercise's checks that ran the edits and matched none

    def run(self) -> None:
        """Run the chapter's checks (those of ``only``) in ``ordered``'s order,
        silent on stdout, recording each one's verdict in ``results``."""
        checks = collected(self.chapter)
        # The checks' modules, by their globals (not in sys.modules: ``_forget_module_of``).
        for namespace in {id(check.function.__globals__): check.function.__globals__ for check in checks}.values():
            for value in namespace.values():
                if isinstance(value, Oracles):
                    value.answer_in(self.mode)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            for check in self.ordered(checks):
                self._run(check)
        if isinstance(self.mode, recorded.Recorder):
            self.mode.record_raised(self.chapter)
        self._settle_hints()

    def _settle_hints(self) -> None:
        """Settle the relations' hints (``grader.relations``), exercise by exercise.

        Where a known bug's hint names an exercise's mistake, the relations'
        hints are left out of that exercise: the catalog keeps its priority,
        and a verdict says one thing. Elsewhere a relation found by comparing
        answers is named only where the exercise's failed comparisons agree
        on it (``relations.held``): one that holds on one check's inputs and
        not on the next (a single position, a degenerate size) does not
        explain the mistake. The same holds of a known bug: where more of
        the exercise's comparisons ran the known bugs, matched none and
        hold something than matched a bug, the bug's answer is the student's
        on those few inputs alone (huge logits, an empty part), and the
        relations are named in its place.
        """
        by_bugs: dict[str, list[CheckResult]] = {}  # results a known bug's hint explains, not an error's
        for result in self.results:
            if result.hint and not result.relation and result.kind not in (Failure.ERROR, Failure.DEVICE):
                by_bugs.setdefault(result.exercise, []).append(result)
        otherwise: dict[str, int] = {}  # comparisons that ran the known bugs and hold something else
        for result, found, edits_tried in self._examined:
            if edits_tried and found and result.kind != Failure.ERROR:  # an error is no comparison of values
                otherwise[result.exercise] = otherwise.get(result.exercise, 0) + 1
        if relations.ENABLED:
            for exercise, results in by_bugs.items():
                if otherwise.get(exercise, 0) > len(results):
                    for result in results:
                        result.hint = None
        named = {result.exercise for result in self.results if result.hint and not result.relation}
        examined: dict[str, list[set[str]]] = {}
        tried: dict[str, list[bool]] = {}
        for result, found, edits_tried in self._examined:
            examined.setdefault(result.exercise, []).append({one.key for one in found})
            tried.setdefault(result.exercise, []).append(edits_tried)
        held = {exercise: relations.held(sets, tried[exercise]) for exercise, sets in examined.items()}
        for result, found, _ in self._examined:
            kept = relations.said([one for one in found if one.key in held[result.exercise]])
            result.hint, result.relation = (kept.hint, kept.name) if kept else (None, None)
        for result in self.results:
            if result.relation and result.exercise in named:
                result.hint = result.relation = None

    def _edits_left(self, exercise: str) -> frozenset[str] | None:
        """The edits of the reference (their sentences) that every comparison
        of ``exercise`` so far that tried them and holds something holds
        (``relations.Seen``); None where none holds anything yet. None is
        left once ``MISSED_EDITS`` checks that ran them matched none:
        a student's slip shows in the first checks it fails, and each try
        runs every edit (a model built and run, hundreds of times)."""
        if self._edits_missed.get(exercise, 0) >= MISSED_EDITS:
            return frozenset()
        prefix = f"{relations.EDIT}:"
        held = [{one.key for one in found} for result, found, edits_tried in self._examined
                if result.exercise == exercise and edits_tried and found]
        if not held:
            return None
        return frozenset(key.removeprefix(prefix) for key in set.intersection(*held) if key.startswith(prefix))

    def ordered(self, checks: tuple[Check, ...]) -> list[Check]:
        """Each exercise's checks together, in catalog order: an exercise gets
        one worker, however its checks are laid out in the file (a chapter's
        shared checks sit at its end). Exercises that preload
        (``Exercise.preload``) go last, and the portability checks after them,
        giving the imports the most time to be made beside the other checks.
        Those not asked for are left out."""
        names = [exercise.name for exercise in self.chapter.exercises]

        def order(check: Check) -> tuple[bool, bool, int]:
            if check.exercise not in names:
                return check.last, False, len(names)
            return check.last, bool(self.chapter.exercise(check.exercise).preload), names.index(check.exercise)

        wanted = [check for check in checks if self.only is None or check.exercise in self.only]
        return sorted(wanted, key=order)  # stable: within an exercise, the file's order

    def _run(self, check: Check) -> None:
        """Set up the check's fixtures, call it, and record its verdict: the
        setup's, where that failed, else the call's."""
        self._hints_seen.edits_left = self._edits_left(check.exercise)
        try:
            arguments = {name: check.parameters[name] if name in check.parameters else self._fixture(name, check)
                         for name in check.arguments}
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # noqa: BLE001 - a check's setup broke: its verdict says so
            self._record(self._result(check, error))
            return
        error = None
        tried = self._hints_seen.edits_tried
        try:
            check.function(**arguments)
        except KeyboardInterrupt:
            raise
        except BaseException as raised:  # noqa: BLE001 - every way a check ends is a verdict
            error = raised
        result = self._result(check, error)
        hint = error.hint if isinstance(error, CheckFailure) else None
        if self._hints_seen.edits_tried > tried and not (isinstance(hint, relations.RelationHints) and any(
                one.name == relations.EDIT for one in hint.hints)):  # the edits ran, and none gave the answer
            self._edits_missed[check.exercise] = self._edits_missed.get(check.exercise, 0) + 1
        result.reached = tuple(sorted(self.remote.reached))
        self._record(result)

    def _record(self, result: CheckResult) -> None:
        self.results.append(result)
        if result.hint and not result.relation and result.hint not in self._hints_seen:
            self._hints_seen.append(result.hint)

    # -- fixtures ------------------------------------------------------------------

    def _fixture(self, name: str, check: Check):
        if name == "submission":
            self.remote.begin_check(check.exercise)
            return self.remote
        if name == "reference":
            return self.mode.reference(self.chapter, check.id, self.reference_module)
        if name == "bugs":
            return self.mode.bugs(self.chapter, check.id, self.reference_module, self._hints_seen)
        if name == "inputs":
            return Inputs(self.seed, check.id)
        raise LookupError(f"check {check.id} asks for {name!r}, which is neither a fixture "
                          f"(submission, reference, bugs, inputs) nor one of its parameters")

    def reference_module(self, chapter: Chapter):
        """The chapter's reference solution, imported once (trusted code).
        ``chapter`` is this run's (``recorded`` passes it back)."""
        if self._reference is None:
            spec = importlib.util.spec_from_file_location(f"reference_{chapter.module}", chapter.solution())
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self._reference = module
        return self._reference

    # -- verdicts --------------------------------------------------------------------

    def _result(self, check: Check, error: BaseException | None) -> CheckResult:
        result = CheckResult(self.chapter.id, check.exercise, check.title, "passed")
        if error is None:
            return result
        if isinstance(error, pytest.skip.Exception):
            result.outcome, result.message = "skipped", str(error)
        elif isinstance(error, Noted):
            result.note = error.message + (f" ({error.hint})" if error.hint else "")
            result.moot_if_failed = error.moot_if_failed
        elif isinstance(error, CheckFailure):
            result.outcome, result.message, result.kind = "failed", error.message, error.kind
            result.summary = error.summary
            result.hint = error.hint or _error_hint(result)
            if result.hint is None and error.raised is not None:
                # Raised where the reference returns: edits of it that raise the same on the same
                # inputs may name the slip (named once the exercise's checks have run).
                slips = [hint for hint, text in self.mode.raising(self.chapter, error.raised, self._hints_seen)
                         if text == error.raised.text]
                error.hint = relations.RelationHints(slips) if slips else None
            related = relations.RelationHints([error.hint]) if isinstance(error.hint, relations.RelationHint) \
                else error.hint if isinstance(error.hint, relations.RelationHints) else None
            if related is not None:  # variants or edits of the reference matched: not a known bug's hint
                result.hint = None
            edits_tried = related is not None or (error.compared is not None and error.compared.edits_tried)
            if result.hint is None and (related is not None or error.compared is not None):
                # Named once the exercise's checks have run (``_settle_hints``), from the
                # relations that hold between the values compared and the variants or edits matched.
                compared = error.compared
                found = relations.examine(compared.got, compared.expected, compared.axes, compared.rtol,
                                          compared.atol, chapter=self.chapter.id) if compared else None
                if related is not None:
                    found = list({one.key: one for one in [*relations.found_in(related), *(found or ())]}.values())
                if found is not None:
                    self._examined.append((result, found, edits_tried))
        else:
            result.outcome, result.kind = "failed", Failure.GRADER_ERROR
            result.message = (f"the grader itself failed in this check "
                              f"({type(error).__name__}: {error}); please report it")
            result.details = "".join(traceback.format_exception(error))
        return result


def _error_hint(result: CheckResult) -> str | None:
    """The hint of a known bug that raises the error this check met."""
    if result.kind not in (Failure.ERROR, Failure.DEVICE):
        return None
    for bug in KNOWN_BUGS.get(result.chapter, ()):
        if bug.exercise == result.exercise and bug.error and re.search(bug.error, result.message):
            return bug.hint
    return None
