"""Correct code, in the styles students and real codebases write, gets full marks.

``tests/correct_styles/`` holds whole chapter files written another way than
the reference: einsum, Python loops, float64 or float32 inside, nanoGPT,
Hugging Face, Meta's llama, the Annotated Transformer, OpenNMT,
FlashAttention's loop orders. Each is first shown equal to the reference on
random inputs within the docstrings' contract (so that the corpus itself is
right), then graded on five seeds: one lost point anywhere fails the test,
so that no later check can bring in a false fail unnoticed. (An exercise
whose checks draw nothing from the seed, named in ``SEED_FREE`` of its
chapter's test file, chapter 8's ``train``, is graded on the first seed
alone: the other four would repeat it exactly.)

The calls an exercise is tried on are its chapter's, ``samples(draw)`` in
``tests/test_chNN_slug.py``; the rules below walk the catalog, so that a new
chapter without sample calls or three correct styles fails, saying which.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import DEVICE, RECIPE, TRAINING, Draw, chapter_tests, solution_source
from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter, find_chapter
from grader.grading import grade
from grader.inputs import Inputs

CORPUS = sorted((COURSE_ROOT / "tests" / "correct_styles").glob("ch*.py"))
SEEDS = (1, 2, 3, 4, 5)


def load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chapter_of(path: Path):
    return find_chapter(path.name[:4])


def sample_calls(chapter: Chapter, seed: int) -> list:
    """``[(exercise name, args, kwargs), ...]``: the calls of ``samples`` in the
    chapter's test file, on random inputs within each docstring's contract."""
    return chapter_tests(chapter, "samples").samples(Draw(seed))


def seed_free(chapter: Chapter) -> tuple[str, ...]:
    """Its exercises whose checks take no input from the seed (``SEED_FREE`` in
    its test file, if any): graded on the first seed only."""
    return tuple(getattr(chapter_tests(chapter), "SEED_FREE", ()))


def _answer(module: types.ModuleType, name: str, args: tuple, kwargs: dict, state=None):
    """Call the function ``name``, or build the class ``name`` from ``args =
    (init, call args, call kwargs)`` with the parameters ``state`` and call it;
    for a class, ``kwargs`` may name another ``method`` than forward, or a
    function the module is ``passed_to`` (as ``ModuleCall`` does)."""
    value = getattr(module, name)
    if not isinstance(value, type):
        return value(*args, **kwargs), None
    init, call_args, call_kwargs = args
    torch.manual_seed(0)
    instance = value(*init).eval()
    if state is not None:
        names = {parameter_name for parameter_name, _ in instance.named_parameters()}
        assert names == set(state), f"{name}'s parameters are named {sorted(names)}"
        instance.load_state_dict(state, strict=False)
    if "passed_to" in kwargs:
        call = functools.partial(getattr(module, kwargs["passed_to"]), instance)
    else:
        call = getattr(instance, kwargs.get("method", "__call__"))
    with torch.no_grad():
        return call(*call_args, **call_kwargs), dict(instance.named_parameters())


def assert_same(got, expected, what: str) -> None:
    if isinstance(expected, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(expected), what
        for index, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, f"{what}[{index}]")
        return
    if isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == expected.dtype, what
        got, expected = torch.from_numpy(got), torch.from_numpy(expected)
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True, msg=what)
    else:
        assert got == expected, what


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")  # new_tensor(cpu_mask) is the style
@pytest.mark.parametrize("path", CORPUS, ids=[path.stem for path in CORPUS])
def test_the_corpus_file_equals_the_reference(path):
    chapter = chapter_of(path)
    reference = load(chapter.solution(), f"reference_{chapter.module}")
    candidate = load(path, f"correct_{path.stem}")
    for seed in (0, 1):
        for name, args, kwargs in sample_calls(chapter, seed):
            if chapter.exercise(kwargs.get("passed_to", name)).optional and not hasattr(candidate, name):
                continue  # an optional exercise the file leaves out
            expected, state = _answer(reference, name, args, kwargs)
            got, _ = _answer(candidate, name, args, kwargs, state)
            assert_same(got, expected, f"{path.name}: {name} (seed {seed})")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_every_exercise_is_sampled_and_has_three_correct_styles(chapter):
    """Every chapter of the catalog: its test file's samples call each exercise
    (but those it names in ``UNSAMPLED``, which grading alone checks), and
    three corpus files at least write each one, an optional one too."""
    tests = chapter_tests(chapter, "samples")
    sampled = {kwargs.get("passed_to", name) for name, _, kwargs in sample_calls(chapter, 0)}
    unsampled = set(getattr(tests, "UNSAMPLED", ()))
    missing = [exercise.name for exercise in chapter.exercises if exercise.name not in sampled | unsampled]
    assert not missing, (f"samples(draw) in tests/test_{chapter.module}.py calls no {', '.join(missing)}: "
                         f"add a call of each ({RECIPE})")
    write_more = (f"write tests/correct_styles/{chapter.id}_<style>.py, the whole chapter written another way "
                  f"than the reference, until three files write each exercise ({RECIPE})")
    styles = [path for path in CORPUS if path.name.startswith(f"{chapter.id}_")]
    assert len(styles) >= 3, f"{chapter.id} has {len(styles)} correct styles: {write_more}"
    for exercise in chapter.exercises:
        writers = [path.name for path in styles if f"class {exercise.name}(" in path.read_text(encoding="utf-8")
                   or f"def {exercise.name}(" in path.read_text(encoding="utf-8")]
        assert len(writers) >= 3, f"{chapter.id} {exercise.name} is written by {writers}: {write_more}"
    for path in styles:
        assert path.read_text(encoding="utf-8") != solution_source(chapter), f"{path.name} is the reference itself"


def _rounds() -> list[list[Path]]:
    """The corpus in rounds of at most one file per chapter: a round is
    graded as one course, its chapters side by side."""
    by_chapter: dict[str, list[Path]] = {}
    for path in CORPUS:
        by_chapter.setdefault(path.name[:4], []).append(path)
    depth = max(len(paths) for paths in by_chapter.values())
    return [[paths[index] for paths in by_chapter.values() if index < len(paths)] for index in range(depth)]


ROUNDS = _rounds()


def _checks_of(chapter: Chapter, exercise: str) -> list:
    """The check functions of ``exercise``, and the portability cases
    ``(check, make_args)`` that call it, in its chapter's check file."""
    module = importlib.import_module(f"{chapter.package}.{chapter.checks.stem}")
    checks, cases = [], []
    for name, value in vars(module).items():
        if not name.startswith("test_"):
            continue
        marks = getattr(value, "pytestmark", [])
        if any(mark.name == "exercise" and mark.args == (exercise,) for mark in marks):
            checks.append(value)
        for mark in marks:
            if mark.name == "parametrize":
                cases += [(value, case.values[1]) for case in mark.args[1]
                          if any(m.name == "exercise" and m.args == (exercise,) for m in getattr(case, "marks", ()))]
    return checks, cases


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_an_exercise_graded_on_one_seed_takes_nothing_from_the_seed(chapter):
    if not seed_free(chapter):
        pytest.skip(f"{chapter.id} has every exercise graded on five seeds")
    for exercise in seed_free(chapter):
        checks, cases = _checks_of(chapter, exercise)
        assert checks, f"{chapter.id} has no checks of {exercise}"
        for check in checks:  # the seed reaches a check through its inputs fixture only
            assert "inputs" not in inspect.signature(check).parameters, check.__name__
        for check, make_args in cases:  # a case that is handed the inputs makes its arguments without them
            first, second = make_args(Inputs(1, check.__name__)), make_args(Inputs(2, check.__name__))
            assert_same(list(first[0]), list(second[0]), f"{check.__name__}[{exercise}]")
            assert first[1] == second[1], f"{check.__name__}[{exercise}]"


@pytest.mark.parametrize("paths", ROUNDS, ids=[f"round{index}" for index in range(1, len(ROUNDS) + 1)])
def test_every_corpus_file_gets_full_marks_on_five_seeds(paths):
    chapters = [chapter_of(path) for path in paths]
    every = {exercise.name for chapter in chapters for exercise in chapter.exercises}
    seeded = every - {name for chapter in chapters for name in seed_free(chapter)}
    lost = []
    for seed in SEEDS:
        report = grade([(chapter_of(path), path) for path in paths], DEVICE, limits=TRAINING, seed=seed, jobs=2,
                       only=None if seed == SEEDS[0] else seeded)
        files = {chapter_of(path).id: path.name for path in paths}
        lost += [f"{files[result.chapter.id]}, seed {seed}: {result.exercise.name}: {result.reason} -- "
                 f"{result.failed_checks[0].message if result.failed_checks else ''}"
                 for result in report.exercises if result.status != "passed"
                 and not (result.exercise.optional and result.status == "not attempted")]
    assert not lost, "\n".join(lost)
