"""The pytest plugin that runs the hidden checks and collects their verdicts.

The checks in ``grader/chapters/chNN/`` are ordinary pytest tests. This plugin gives
them their fixtures (``submission``, ``reference``, ``bugs``, ``inputs``)
and records, for each check, its exercise, its outcome and the
one sentence a student reads. Nothing here trusts the submission: its code
runs in workers, and outcomes are recorded in this process only.
"""

from __future__ import annotations

import importlib.util
import re
import traceback
from dataclasses import dataclass

import pytest

from grader import recorded
from grader.catalog import Chapter
from grader.checks import Oracles
from grader.compare import CheckFailure, Noted
from grader.inputs import Inputs
from grader.known_bugs import KNOWN_BUGS, LiveBugs
from grader.outcomes import Failure
from grader.remote_submission import RemoteSubmission


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
    summary: str = ""  # a mismatch in a few words: where, how large
    details: str = ""  # a grader error's traceback, for --verbose
    reached: tuple[str, ...] = ()  # the exercises it builds on that the check's calls ran
    note: str = ""  # a passed check's note (``compare.note``): never a point
    moot_if_failed: bool = False  # the note is left out of a failed exercise's row


def check_title(item: pytest.Item) -> str:
    """The sentence a check's docstring gives, with its parameters."""
    doc = (getattr(item, "function", None).__doc__ or "").strip().splitlines()
    title = doc[0].rstrip(".") if doc else item.originalname.removeprefix("test_").replace("_", " ")
    callspec = getattr(item, "callspec", None)
    return f"{title} [{callspec.id}]" if callspec else title


class GradingPlugin:
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
        self.seed = seed
        self.mode = mode
        self.only = only
        self.results: list[CheckResult] = []
        self._reference: object | None = None
        self._hints_seen: list[str] = []  # what the failed checks so far matched, first first

    # -- fixtures ------------------------------------------------------------------

    @pytest.fixture
    def submission(self, request: pytest.FixtureRequest) -> RemoteSubmission:
        self.remote.begin_check(_exercise_of(request.node))
        return self.remote

    @pytest.fixture
    def reference(self, request: pytest.FixtureRequest):
        return self.mode.reference(self.chapter, request.node.nodeid, self.reference_module)

    @pytest.fixture
    def bugs(self, request: pytest.FixtureRequest) -> LiveBugs:
        return self.mode.bugs(self.chapter, request.node.nodeid, self.reference_module, self._hints_seen)

    @pytest.fixture
    def inputs(self, request: pytest.FixtureRequest) -> Inputs:
        return Inputs(self.seed, request.node.nodeid)

    def reference_module(self, chapter: Chapter):
        """The chapter's reference solution, imported once (trusted code).
        ``chapter`` is this plugin's (``recorded`` passes it back)."""
        if self._reference is None:
            spec = importlib.util.spec_from_file_location(f"reference_{chapter.module}", chapter.solution())
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self._reference = module
        return self._reference

    # -- hooks -----------------------------------------------------------------------

    def pytest_configure(self, config: pytest.Config) -> None:
        config.addinivalue_line("markers", "exercise(name): the catalog exercise a check judges")
        config.addinivalue_line("markers", "portability: a check run last in its chapter, on meta")

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Run each exercise's checks together, in catalog order: an exercise
        gets one worker, however its checks are laid out in the file (a
        chapter's shared checks sit at its end). Exercises that preload
        (``Exercise.preload``) go last, and the portability checks after
        them, giving the imports the most time to be made beside the other
        checks. Drop those not asked for. The chapter's ``Oracles`` answer
        in this grade's mode."""
        for module in {item.module for item in items if getattr(item, "module", None) is not None}:
            for value in vars(module).values():
                if isinstance(value, Oracles):
                    value.answer_in(self.mode)
        if self.only is not None:
            dropped = [item for item in items if _exercise_of(item) not in self.only]
            items[:] = [item for item in items if _exercise_of(item) in self.only]
            config.hook.pytest_deselected(items=dropped)

        names = [exercise.name for exercise in self.chapter.exercises]

        def order(item: pytest.Item) -> tuple[bool, bool, int]:
            name = _exercise_of(item)
            last = item.get_closest_marker("portability") is not None
            if name not in names:
                return last, False, len(names)
            return last, bool(self.chapter.exercise(name).preload), names.index(name)

        items.sort(key=order)  # stable: within an exercise, the file's order

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
        """Record the verdict and make pytest's report ourselves.

        pytest's own report would format a traceback of every failure, parsing
        the source of each frame: most of a grading run's time, for text
        nobody reads. A check's failure is the sentence it raised.
        """
        result = self._result(item, call)
        if call.when == "call" or result.outcome != "passed":
            self.results.append(result)
        if result.hint and result.hint not in self._hints_seen:
            self._hints_seen.append(result.hint)
        longrepr = None
        if call.excinfo is not None and result.outcome != "passed":
            location = (str(item.path), (item.location[1] or 0) + 1)
            longrepr = result.message if result.outcome == "failed" else (*location, result.message)
        return pytest.TestReport(
            nodeid=item.nodeid, location=item.location, keywords={k: 1 for k in item.keywords},
            outcome=result.outcome, longrepr=longrepr, when=call.when, sections=[],
            duration=call.duration, user_properties=item.user_properties,
        )

    def _result(self, item: pytest.Item, call: pytest.CallInfo) -> CheckResult:
        result = CheckResult(self.chapter.id, _exercise_of(item), check_title(item), "passed")
        if call.when == "call":
            result.reached = tuple(sorted(self.remote.reached))
        error = call.excinfo.value if call.excinfo is not None else None
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


def _exercise_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("exercise")
    if marker is None or not marker.args:
        raise LookupError(f"check {item.nodeid} has no @exercise marker")
    return marker.args[0]
