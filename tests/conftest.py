"""Shared helpers: write a submission to a temporary folder and grade it."""

from __future__ import annotations

import importlib
import itertools
import math
import os
import pickle
import shutil
import types
from pathlib import Path

import pytest
import torch

from grader.chapters import KnownBug
from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter, find_chapter
from grader.grading import GradeReport, grade, preload
from grader.known_bugs import function_span
from grader.sandbox import Limits

# Under pytest-xdist the suite runs one process a core already: torch's threads in each,
# and in the kernels, graders and editions they start, would only fight over the cores
# (a notebook's run took three times as long beside another test process).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# The files that take longest, longest first (bench/test_suite.py prints each
# file's seconds). Side by side, each process takes the next file when it is
# done with one (--dist loadfile, in the order collected), so a long file
# taken last leaves one process working alone at the end; taken first, the
# short files fill in around it. The other files keep their order.
# The first two are taken at once, one by each process, and each starts one of the
# suite's two long shared computations (conftest's ``edition`` and ``verification``):
# test_release_replay's one test needs both, the edition first, which it writes while
# test_known_bugs's process runs the verify; then it runs verify in the edition's mode.
LONGEST_FIRST = ("test_release_replay.py", "test_known_bugs.py", "test_correct_styles.py", "test_notebooks.py",
                 "test_attacks.py", "test_release.py", "test_gradescope.py", "test_prairielearn.py",
                 "test_secrets.py", "test_scaffold.py", "test_batch.py", "test_cluster.py", "test_course.py")


# The suite's shared computations, each a few minutes on a loaded machine (``verification``
# took more than 300 s beside three other test runs). A test that uses one may be the one
# that computes it, or waits for the process that does, in its setup, which pytest-timeout
# counts: such a test may take SHARED_TIMEOUT before it is called a hang, unless it says.
SHARED_FIXTURES = ("verification", "edition")
SHARED_TIMEOUT = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order
    for item in items:
        if (set(SHARED_FIXTURES) & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("timeout") is None):
            item.add_marker(pytest.mark.timeout(SHARED_TIMEOUT))


# What a batch imports once before it forks (torch._dynamo, which training
# imports): once in each test process, not once in every grade that trains.
preload(CHAPTERS)


def solution_source(chapter: Chapter) -> str:
    return chapter.solution().read_text(encoding="utf-8")


def stub_source(chapter: Chapter) -> str:
    return chapter.stub().read_text(encoding="utf-8")


# Where the suite's grades run student code: the CPU, unless MHA_COURSE_TEST_DEVICE says
# otherwise (bench/device_check.sh runs the corpus and the attacks with it set to cuda).
DEVICE = torch.device(os.environ.get("MHA_COURSE_TEST_DEVICE", "cpu"))
DEVICE_OPTION = ("--device", DEVICE.type)  # the same, for a grade on the command line

CH01 = find_chapter("ch01")
SOLUTION = solution_source(CH01)
STUB = stub_source(CH01)
# Short limits keep the tests of hangs fast; correct code needs far less.
FAST = Limits(check_seconds=2.0, exercise_seconds=6.0)
# Except chapter 8's training check, which trains for about a second: on a loaded machine
# two would be too close. Tests that grade it keep the default limits.
TRAINING = Limits()


def limits_for(chapters) -> Limits:
    """FAST, unless one of ``chapters`` costs more than its checks (it trains a
    model: ``Chapter.extra_cost``)."""
    return TRAINING if any(chapter.extra_cost for chapter in chapters) else FAST


# A chapter id the course does not have, for tests of how a file named for one
# is refused: the first number the catalog leaves free, so that a new chapter
# moves it on rather than breaking those tests.
NO_SUCH_CHAPTER = next(f"ch{number:02d}" for number in itertools.count(1)
                       if number not in {chapter.number for chapter in CHAPTERS})


# -- what the whole-course tests need of each chapter, from its own test file ----------

TESTS = Path(__file__).resolve().parent
# What a chapter's test file, tests/test_chNN_slug.py, must define, and what for.
CHAPTER_TEST_PARTS = {
    "samples": "samples(draw), the calls tests/test_correct_styles.py makes of every exercise on "
               "the reference and on each correct style: [(exercise name, args, kwargs), ...]",
    "RELEASE_BUG": 'RELEASE_BUG = ("exercise", "bug name"[, "second bug"]), known bugs of its bugs.py '
                   "that tests/test_release.py makes in both trees",
}
RECIPE = 'grader/README.md, "Adding a chapter"'


def chapter_tests(chapter: Chapter, *needed: str) -> types.ModuleType:
    """``tests/test_{chapter.module}.py``, the chapter's own tests, imported;
    it must define each of ``needed`` (names of ``CHAPTER_TEST_PARTS``). A
    missing file or name fails with what to add."""
    path = TESTS / f"test_{chapter.module}.py"
    assert path.is_file(), (f"{chapter.id} has no tests/{path.name}: write it, with "
                            f"{' and '.join(CHAPTER_TEST_PARTS)} ({RECIPE})")
    # The name pytest imports it under (rootdir-relative, no package): one module, not two.
    module = importlib.import_module(path.stem)
    for name in needed:
        assert hasattr(module, name), (f"tests/{path.name} defines no {name}: add "
                                       f"{CHAPTER_TEST_PARTS.get(name, name)} ({RECIPE})")
    return module


class Draw:
    """Seeded random inputs, for a chapter's ``samples(draw)``."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def randn(self, *shape: int, dtype=torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator, dtype=torch.float64).to(dtype)

    def weights(self, *shape: int) -> torch.Tensor:
        """A projection weight scaled so that activations stay near 1."""
        return self.randn(*shape) / math.sqrt(shape[-1])

    def mask(self, *shape: int) -> torch.Tensor:
        """A random bool mask, True = may attend, with key 0 always allowed."""
        mask = torch.rand(*shape, generator=self.generator) < 0.6
        mask[..., 0] = True
        return mask

    def positions(self, *shape: int, below: int = 32) -> torch.Tensor:
        return torch.randint(0, below, shape, generator=self.generator)


def forging(paths: list[Path], forged: dict, mode: str = "w") -> str:
    """Module-level statements that write ``forged`` (as JSON) into each of
    ``paths`` (``open`` with ``mode``) at once, then from a child process
    that outlives its worker and goes on writing for 10 s: added to a
    submission, they try to forge its results or the grader's files."""
    return f'''

import json as _json, os as _os, time as _time

def _forge():
    for path in {[str(path) for path in paths]!r}:
        try:
            with open(path, {mode!r}) as file:
                _json.dump({forged!r}, file)
        except OSError:
            pass

_forge()
try:
    if _os.fork() == 0:  # a process that outlives its worker and keeps writing
        try:
            _os.setsid()
            for _ in range(200):
                _forge()
                _time.sleep(0.05)
        finally:
            _os._exit(0)
except OSError:
    pass
'''


def replace_function(source: str, name: str, new_definition: str) -> str:
    """``source`` with the top-level function (or class) ``name`` replaced."""
    start, end = function_span(source, name)
    return source[:start] + new_definition.strip("\n") + "\n" + source[end:]


def statuses(report: GradeReport) -> dict[str, str]:
    return {result.exercise.name: result.status for result in report.exercises}


def result_of(report: GradeReport, name: str):
    return next(result for result in report.exercises if result.exercise.name == name)


def affected_by(chapter: Chapter, exercise: str) -> set[str]:
    """The exercise and every exercise that builds on it, directly or not."""
    found = {exercise}
    changed = True
    while changed:
        changed = False
        for other in chapter.exercises:
            if other.name not in found and found.intersection(other.uses):
                found.add(other.name)
                changed = True
    return found


def assert_fails_alone(report: GradeReport, exercise: str, chapter: Chapter = CH01) -> str:
    """``exercise`` failed, every exercise that does not build on it kept its
    points; returns the first failed check's message."""
    result = result_of(report, exercise)
    assert result.status == "failed"
    for name, status in statuses(report).items():
        if name not in affected_by(chapter, exercise):
            assert status == "passed", f"{name} should not be affected"
    return result.failed_checks[0].message


def grading_in(folder: Path):
    """``grading_in(folder)(text)`` grades ``text`` as a chapter 1 submission
    written in ``folder``, on ``DEVICE``; ``(text, chapter="ch03")`` as one for
    another chapter. ``grade_source`` is this in a test's ``tmp_path``; a grade
    that outlives its test (test_attacks' ``attack_report``) takes a folder of its own."""

    def run(source: str, limits: Limits = FAST, seed: int = 1234, chapter: str = "ch01",
            only: set[str] | None = None) -> GradeReport:
        target = find_chapter(chapter)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / target.file_name
        path.write_text(source, encoding="utf-8")
        return grade([(target, path)], DEVICE, limits=limits, seed=seed, only=only)

    return run


@pytest.fixture
def grade_source(tmp_path: Path):
    """``grade_source(text)`` grades ``text`` as a chapter 1 submission, on
    ``DEVICE``; ``grade_source(text, chapter="ch03")`` as one for another chapter."""
    return grading_in(tmp_path)


@pytest.fixture
def unscanned(monkeypatch):
    """Grade without the static scan. It only ever adds a note (a forbidden
    call seen in the source), so this changes no point: what the worker and
    the operating system do with student code decides every one, with the
    scan or without it."""
    import grader.static_scan

    monkeypatch.setattr(grader.static_scan, "notes", lambda chapter, submission, only=None: {})


# A "bug" that changes nothing: no check can catch it, so verify must say so.
HARMLESS = KnownBug("softmax", "harmless-comment", "changes nothing",
                    "exps = torch.exp(x - shift)", "exps = torch.exp(x - shift)  # the same")
# A bug caught, but answering as the catalog's sum-of-everything does, which comes first and
# so gives its hint: no check gives this one's own, so verify must say so.
ALIKE = KnownBug("softmax", "sum-of-everything-again", "never given: an earlier bug answers alike",
                 "exps.sum(dim=dim, keepdim=True)", "exps.sum()")
ADDED_BUGS = (HARMLESS, ALIKE)  # what the suite's verify run adds to chapter 1's catalog
VERIFY_SEED = 7


def _verify_in_a_copy(folder: Path):
    """verify with ``ADDED_BUGS`` in the catalog, its build checked in a copy of
    the tree (in ``folder``) whose exercises/ holds a finished chapter 1."""
    from grader.known_bugs import KNOWN_BUGS
    from grader.verify import verify

    # grader/ too: the build writes each lesson's list of checks from the checks' files.
    for name in ("solutions", "chapters", "exercises", "grader"):
        shutil.copytree(COURSE_ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
    work = folder / "exercises" / "ch01_self_attention.py"
    work.write_bytes((COURSE_ROOT / "solutions" / work.name).read_bytes())
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(KNOWN_BUGS, "ch01", (*KNOWN_BUGS["ch01"], *ADDED_BUGS))
        found = verify(seed=VERIFY_SEED, jobs=2, root=folder)
    found.work = work
    return found


def _once_per_suite(request, tmp_path_factory, name: str, make):
    """``make(folder)``, computed once per suite in a new ``folder``, even with
    tests side by side (pytest-xdist): the first process to need it computes
    it under a lock, in the folder every process of the run shares, and the
    others read its pickle (a folder it made is shared as its path). A
    process whose ``make`` failed leaves no pickle: the next to need it tries
    again, in an emptied folder, and fails as the first did."""
    if not hasattr(request.config, "workerinput"):  # one process: no one to share with
        return make(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # the same folder for every process of the run
    cached = shared / f"{name}.pickle"
    with FileLock(str(cached) + ".lock"):
        if not cached.is_file():
            folder = shared / name
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            cached.write_bytes(pickle.dumps(make(folder)))
        return pickle.loads(cached.read_bytes())


@pytest.fixture(scope="session")
def verification(request, tmp_path_factory):
    """One verify run over the whole course (seed ``VERIFY_SEED``), with
    ``ADDED_BUGS`` in chapter 1's catalog, its build checked in a copy of the tree whose
    exercises/ holds a student's finished chapter 1 (``verification.work``):
    the course's own exercises/ stays as it is for the tests running beside
    this one. The suite's one pass over the known-bug catalog in this tree:
    test_verify and test_known_bugs read it, and test_release_replay compares
    the student edition's with it. Once per suite (``_once_per_suite``)."""
    return _once_per_suite(request, tmp_path_factory, "verified-course", _verify_in_a_copy)


# The seed the suite's student edition records, and the one its tests grade
# with: VERIFY_SEED, so that verify in the edition's mode can be compared with
# the suite's verify run in this tree. One seed: recording one costs about two
# minutes of CPU for the whole course, and a second would cover no other code.
EDITION_SEED = VERIFY_SEED
EDITION_SEEDS = (EDITION_SEED,)


def _write_edition(folder: Path) -> Path:
    from grader.edition import write_edition

    write_edition(folder / "mha-course", list(EDITION_SEEDS), jobs=1)
    return folder / "mha-course"


@pytest.fixture(scope="session")
def edition(request, tmp_path_factory) -> Path:
    """The student edition (``mha-course release``) recording ``EDITION_SEEDS``,
    written once per suite (``_once_per_suite``) and shared by every test that
    grades in it or reads it: test_release, test_release_replay, test_secrets.
    Read-only: a test grades inside it (``cwd``, ``PYTHONPATH``) but writes
    its files in its own ``tmp_path``; one that must change the edition
    copies it first."""
    return _once_per_suite(request, tmp_path_factory, "edition", _write_edition)
