"""Correct code, in the styles students and real codebases write, gets full marks.

``tests/correct_styles/`` holds whole chapter files written another way than
the reference: einsum, Python loops, float64 or float32 inside, nanoGPT,
Hugging Face, Meta's llama, the Annotated Transformer, OpenNMT,
FlashAttention's loop orders. Each is first shown equal to the reference on
random inputs within the docstrings' contract (so that the corpus itself is
right), then graded on five seeds: one lost point anywhere fails the test,
so that no later check can bring in a false fail unnoticed. (An exercise
whose checks draw nothing from the seed, chapter 8's ``train``, is graded
on the first seed alone: the other four would repeat it exactly.)
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TRAINING, solution_source
from grader.catalog import COURSE_ROOT, find_chapter
from grader.grading import grade
from grader.inputs import Inputs

CORPUS = sorted((COURSE_ROOT / "tests" / "correct_styles").glob("ch*.py"))
SEEDS = (1, 2, 3, 4, 5)
# Exercises whose checks take no input from the seed: graded on the first seed only.
SEED_FREE = {"ch08": {"train"}}


def load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chapter_of(path: Path):
    return find_chapter(path.name[:4])


# -- random inputs within each docstring's contract --------------------------------


class Draw:
    """Seeded random inputs."""

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


def _ch01(draw: Draw):
    q, k, v = draw.randn(2, 5, 8), draw.randn(2, 7, 8), draw.randn(2, 7, 4)
    empty_row = draw.mask(5, 7)
    empty_row[2] = False  # a query with no key: zero weights, zero output
    additive = torch.zeros(5, 7).masked_fill(~draw.mask(5, 7), float("-inf"))
    x = draw.randn(2, 5, 6)
    return [
        ("softmax", (draw.randn(3, 5) * 3,), {"dim": 0}),
        ("softmax", (draw.randn(2, 3, 4) * 3,), {}),
        ("softmax", (draw.randn(4, 6, dtype=torch.float64),), {"dim": -1}),
        ("scaled_dot_product_attention", (q, k, v), {}),
        ("scaled_dot_product_attention", (q, k, v), {"mask": empty_row, "scale": 0.5}),
        ("scaled_dot_product_attention", (q, k, v), {"mask": additive}),
        ("self_attention", (x, draw.weights(4, 6), draw.weights(4, 6), draw.weights(3, 6)),
         {"mask": draw.mask(5, 5)}),
        ("softmax_numpy", (draw.randn(3, 5).numpy(),), {"axis": 0}),
        ("softmax_numpy", (draw.randn(2, 6, dtype=torch.float64).numpy(),), {}),
        ("scaled_dot_product_attention_numpy", (q.numpy(), k.numpy(), v.numpy()),
         {"mask": draw.mask(5, 7).numpy()}),
    ]


def _ch02(draw: Draw):
    x, context = draw.randn(2, 3, 6), draw.randn(2, 5, 4)
    projections = (draw.weights(8, 6), draw.weights(8, 4), draw.weights(3, 4))
    additive = torch.zeros(2, 3, 4).masked_fill(~draw.mask(2, 3, 4), float("-inf"))
    return [
        ("padding_mask", (torch.tensor([3, 0, 5]),), {"max_len": 6}),
        ("padding_mask", (torch.tensor([3, 1, 4]),), {}),
        ("convert_mask", (draw.mask(2, 3, 4), "attend", "block"), {}),
        ("convert_mask", (draw.mask(2, 3, 4), "block", "additive"), {"dtype": torch.float64}),
        ("convert_mask", (additive, "additive", "attend"), {}),
        ("combine_masks", (draw.mask(2, 5),), {}),
        ("combine_masks", (draw.mask(2, 5), draw.mask(3, 5)), {}),
        ("combine_masks", (draw.mask(2, 5), draw.mask(2, 3, 5)), {}),
        ("cross_attention", (x, context, *projections), {}),
        ("cross_attention", (x, context, *projections), {"context_lengths": torch.tensor([5, 2])}),
        ("cross_attention", (x, context, *projections), {"context_lengths": torch.tensor([0, 3])}),
    ]


def _ch03(draw: Draw):
    query, key = draw.randn(2, 5, 12), draw.randn(2, 7, 12)
    projections = [draw.weights(12, 12) for _ in range(4)]
    in_proj, out_proj = draw.weights(36, 12), draw.weights(12, 12)
    padding = ~draw.mask(2, 7)  # True = ignore, nn.MultiheadAttention's way
    return [
        ("split_heads", (draw.randn(2, 5, 12), 3), {}),
        ("merge_heads", (draw.randn(2, 3, 5, 4),), {}),
        ("multi_head_attention", (query, key, key, 3, *projections), {"mask": draw.mask(5, 7)}),
        ("multi_head_attention", (query, query, query, 4, *projections), {}),
        ("MultiHeadAttention", ((12, 3), (draw.randn(2, 5, 12),), {"mask": draw.mask(5, 5)}), {}),
        ("MultiHeadAttention", ((12, 3), (draw.randn(2, 5, 12),), {"need_weights": True}), {}),
        ("torch_multihead_forward", (query.transpose(0, 1), key.transpose(0, 1), key.transpose(0, 1), 3,
                                     in_proj, draw.randn(36), out_proj, draw.randn(12)),
         {"key_padding_mask": padding}),
        ("torch_multihead_forward", (query, key, key, 4, in_proj, None, out_proj, None), {"batch_first": True}),
        ("parameter_count", (12, 3), {}),
        ("parameter_count", (8, 2, False), {}),
    ]


def _ch04(draw: Draw):
    x = draw.randn(2, 5, 8)
    projections = (draw.weights(8, 8), draw.weights(8, 8), draw.weights(6, 8), draw.weights(4, 6))
    cache = (draw.randn(2, 2, 4, 4), draw.randn(2, 2, 4, 3))
    return [
        ("causal_mask", (4,), {}),
        ("causal_mask", (3, 6), {}),
        ("causal_self_attention", (x, 2, *projections), {}),
        ("causal_self_attention", (x, 2, *projections), {"lengths": torch.tensor([5, 0])}),
        ("attend_with_cache", (draw.randn(2, 3, 8), 2, *projections), {"cache": cache}),
        ("attend_with_cache", (draw.randn(2, 3, 8), 2, *projections), {}),
    ]


def _ch05(draw: Draw):
    x, positions = draw.randn(2, 5, 8), draw.positions(2, 5)
    attention = (16, 2, 32, 10000.0, *(draw.weights(16, 16) for _ in range(4)), draw.randn(2, 6, 16))
    return [
        ("rope_angles", (positions, 8), {}),
        ("apply_rope", (x, positions), {}),
        ("apply_rope", (draw.randn(3, 4, 6, dtype=torch.float64), draw.positions(4)), {"theta": 500.0}),
        ("apply_rope_half", (x, positions), {}),
        ("adjacent_to_half_permutation", (8,), {}),
        ("rope_self_attention", attention, {}),
        ("rope_self_attention", attention, {"token_positions": draw.positions(2, 6)}),
    ]


def _ch06(draw: Draw):
    q, k, v = draw.randn(2, 6, 4, 3), draw.randn(2, 2, 5, 3), draw.randn(2, 2, 5, 2)
    return [
        ("expand_kv_heads", (draw.randn(2, 2, 5, 3), 6), {}),
        ("grouped_query_attention", (q, k, v), {}),
        ("grouped_query_attention", (q, k, v), {"mask": draw.mask(4, 5)}),
        ("GroupedQueryAttention", ((12, 6, 2), (draw.randn(2, 5, 12),), {"mask": draw.mask(5, 5)}), {}),
        ("kv_cache_bytes", (2, 128, 4, 2, 64, torch.bfloat16), {}),
    ]


def _ch07(draw: Draw):
    q, k, v = draw.randn(2, 6, 8), draw.randn(2, 10, 8), draw.randn(2, 10, 5)
    lse_b = draw.randn(2, 6)
    lse_b[0, 1] = float("-inf")  # a query with no key among B
    return [
        ("online_softmax", (draw.randn(3, 10) * 3, 4), {}),
        ("tiled_attention", (q, k, v, 4), {}),
        ("tiled_attention", (q, k, v, 3), {"causal": True}),
        # More queries than keys: the first two see none (zeros, lse -inf).
        ("tiled_attention", (draw.randn(2, 12, 8), k, v, 4), {"causal": True}),
        ("merge_attention", (draw.randn(2, 6, 5), draw.randn(2, 6), draw.randn(2, 6, 5), lse_b), {}),
    ]


def _ch08(draw: Draw):
    tokens = torch.randint(0, 20, (2, 8), generator=draw.generator)
    cache = (draw.randn(2, 2, 3, 8), draw.randn(2, 2, 3, 8))  # (B, H, T_past, d) keys and values
    caches = [(draw.randn(2, 2, 5, 8), draw.randn(2, 2, 5, 8)) for _ in range(2)]  # one a block
    cached = {"method": "forward_with_cache"}
    return [
        ("TransformerBlock", ((16, 2), (draw.randn(2, 5, 16),), {}), {}),
        ("TransformerBlock", ((16, 2), (draw.randn(2, 4, 16),), {}), cached),
        ("TransformerBlock", ((16, 2), (draw.randn(2, 1, 16), cache), {}), cached),
        ("TransformerBlock", ((16, 2), (draw.randn(2, 2, 16), cache), {}), cached),
        ("TinyLM", ((20, 16, 2, 2, 8), (tokens,), {}), {}),
        ("TinyLM", ((20, 16, 2, 2, 8), (tokens[:, :5],), {}), cached),
        ("TinyLM", ((20, 16, 2, 2, 8), (tokens[:, 5:], caches), {}), cached),
        ("TinyLM", ((20, 16, 2, 2, 8), (tokens[:, :2], 5), {}), {"passed_to": "generate"}),
        ("TinyLM", ((20, 16, 2, 1, 8), (tokens[:1, :1], 7), {}), {"passed_to": "generate"}),
        ("RoPETransformerBlock", ((16, 2), (draw.randn(2, 5, 16),), {}), {}),
        ("RoPETransformerBlock", ((16, 2, 500.0), (draw.randn(2, 4, 16),), {}), cached),
        ("RoPETransformerBlock", ((16, 2), (draw.randn(2, 2, 16), cache), {}), cached),
    ]


SAMPLES = {"ch01": _ch01, "ch02": _ch02, "ch03": _ch03, "ch04": _ch04,
           "ch05": _ch05, "ch06": _ch06, "ch07": _ch07, "ch08": _ch08}


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
        for name, args, kwargs in SAMPLES[chapter.id](Draw(seed)):
            if chapter.exercise(kwargs.get("passed_to", name)).optional and not hasattr(candidate, name):
                continue  # an optional exercise the file leaves out
            expected, state = _answer(reference, name, args, kwargs)
            got, _ = _answer(candidate, name, args, kwargs, state)
            assert_same(got, expected, f"{path.name}: {name} (seed {seed})")


def test_every_exercise_is_sampled_and_every_chapter_has_three_styles():
    for chapter_id, samples in SAMPLES.items():
        chapter = find_chapter(chapter_id)
        sampled = {kwargs.get("passed_to", name) for name, _, kwargs in samples(Draw(0))}
        trained = {"train"}  # checked by grading alone: its losses follow its own random draws
        assert sampled | trained >= {exercise.name for exercise in chapter.exercises}, chapter_id
        styles = [path for path in CORPUS if path.name.startswith(chapter_id)]
        assert len(styles) >= 3, f"{chapter_id} has {len(styles)} correct styles"
        for exercise in chapter.exercises:  # an optional one too, by three files at least
            writers = [path for path in styles if f"class {exercise.name}(" in path.read_text(encoding="utf-8")
                       or f"def {exercise.name}(" in path.read_text(encoding="utf-8")]
            assert len(writers) >= 3, f"{chapter_id} {exercise.name}: {len(writers)} correct styles"
        for path in styles:
            assert path.read_text(encoding="utf-8") != solution_source(chapter)


def _rounds() -> list[list[Path]]:
    """The corpus in rounds of at most one file per chapter: a round is
    graded as one course, its chapters side by side."""
    by_chapter: dict[str, list[Path]] = {}
    for path in CORPUS:
        by_chapter.setdefault(path.name[:4], []).append(path)
    depth = max(len(paths) for paths in by_chapter.values())
    return [[paths[index] for paths in by_chapter.values() if index < len(paths)] for index in range(depth)]


ROUNDS = _rounds()


def _checks_of(chapter_id: str, exercise: str) -> list:
    """The check functions of ``exercise``, and the portability cases
    ``(check, make_args)`` that call it, in its chapter's check file."""
    module = importlib.import_module(f"grader.checks.test_{find_chapter(chapter_id).module}")
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


@pytest.mark.parametrize("chapter_id, exercise", [(c, e) for c, names in SEED_FREE.items() for e in names])
def test_an_exercise_graded_on_one_seed_takes_nothing_from_the_seed(chapter_id, exercise):
    checks, cases = _checks_of(chapter_id, exercise)
    assert checks, f"{chapter_id} has no checks of {exercise}"
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
    seeded = every - {name for chapter in chapters for name in SEED_FREE.get(chapter.id, ())}
    lost = []
    for seed in SEEDS:
        report = grade([(chapter_of(path), path) for path in paths], limits=TRAINING, seed=seed, jobs=2,
                       only=None if seed == SEEDS[0] else seeded)
        files = {chapter_of(path).id: path.name for path in paths}
        lost += [f"{files[result.chapter.id]}, seed {seed}: {result.exercise.name}: {result.reason} -- "
                 f"{result.failed_checks[0].message if result.failed_checks else ''}"
                 for result in report.exercises if result.status != "passed"
                 and not (result.exercise.optional and result.status == "not attempted")]
    assert not lost, "\n".join(lost)
