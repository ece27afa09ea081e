"""Realistic wrong implementations, written as edits of the reference solution.

Each known bug is a one-line change to a function in ``solutions/`` (the
line a student really gets wrong) with a hint in words. The catalog serves
twice:

* the project's tests write each buggy file and prove that the checks fail
  the exercise that holds the bug;
* while grading, when a value does not match the reference, the grader runs
  the buggy versions on the same inputs, in its own process (this is the
  course's code, not the student's), and when one gives the student's value
  the message names the likely bug.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from grader.catalog import COURSE_ROOT, Chapter


@dataclass(frozen=True)
class KnownBug:
    """Replace ``old`` by ``new`` inside the function ``exercise``."""

    exercise: str
    name: str
    hint: str
    old: str
    new: str


_UNSCALED = "looks like the scores are not multiplied by 1/sqrt(d_k)"
_OVER_QUERIES = ("looks like the softmax runs over the queries (dim=-2); each query's "
                 "weights must sum to 1 over the keys (dim=-1)")
_NO_MAX = "looks like the maximum is not subtracted before exp (exp overflows, then NaN)"

KNOWN_BUGS: dict[str, tuple[KnownBug, ...]] = {
    "ch01": (
        KnownBug("softmax", "no-max-shift", _NO_MAX,
                 "exps = torch.exp(x - shift)", "exps = torch.exp(x)"),
        KnownBug("softmax", "sum-of-everything",
                 "looks like you divide by the sum of all entries instead of the sum along dim",
                 "exps.sum(dim=dim, keepdim=True)", "exps.sum()"),
        KnownBug("scaled_dot_product_attention", "no-scale", _UNSCALED,
                 "scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0"),
        KnownBug("scaled_dot_product_attention", "scale-by-d",
                 "looks like the scores are divided by d_k instead of sqrt(d_k)",
                 "scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0 / q.shape[-1]"),
        KnownBug("scaled_dot_product_attention", "softmax-over-queries", _OVER_QUERIES,
                 "softmax(scores.masked_fill(no_keys, 0.0), dim=-1)",
                 "softmax(scores.masked_fill(no_keys, 0.0), dim=-2)"),
        KnownBug("scaled_dot_product_attention", "mask-inverted",
                 "looks like the mask is inverted: in this course True means the query "
                 "may attend to the key (nn.MultiheadAttention uses the opposite)",
                 "scores.masked_fill(~mask,", "scores.masked_fill(mask,"),
        KnownBug("scaled_dot_product_attention", "weights-transposed",
                 "looks like the weights are transposed: they have one row per query, "
                 "shape (..., L, S)",
                 "return weights @ v, weights", "return weights @ v, weights.transpose(-2, -1)"),
        KnownBug("scaled_dot_product_attention", "finite-mask-fill",
                 "looks like masked scores are set to a finite number such as -1e9: a query "
                 "whose keys are all masked then averages every value instead of giving zeros",
                 'scores.masked_fill(~mask, float("-inf"))', "scores.masked_fill(~mask, -1e9)"),
        KnownBug("scaled_dot_product_attention", "nan-for-empty-rows",
                 "looks like a query whose keys are all masked gets NaN; the course's rule "
                 "is zero weights and zero output for such a query",
                 "weights = softmax(scores.masked_fill(no_keys, 0.0), dim=-1)  # (..., L, S)\n"
                 "    weights = weights.masked_fill(no_keys, 0.0)",
                 "weights = softmax(scores, dim=-1)  # (..., L, S)"),
        KnownBug("self_attention", "x-times-w",
                 "looks like the projections compute x @ W instead of x @ W.T (weights are "
                 "stored (d_out, d_in), as nn.Linear stores them)",
                 "q = x @ w_q.T", "q = x @ w_q"),
        KnownBug("self_attention", "query-weights-for-keys",
                 "looks like the keys are projected with w_q instead of w_k",
                 "k = x @ w_k.T", "k = x @ w_q.T"),
        KnownBug("softmax_numpy", "no-max-shift", _NO_MAX,
                 "exps = np.exp(x - shift)", "exps = np.exp(x)"),
        KnownBug("scaled_dot_product_attention_numpy", "no-scale", _UNSCALED,
                 "scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0"),
        KnownBug("scaled_dot_product_attention_numpy", "softmax-over-queries", _OVER_QUERIES,
                 "softmax_numpy(np.where(no_keys, 0, scores), axis=-1)",
                 "softmax_numpy(np.where(no_keys, 0, scores), axis=-2)"),
    ),
}


def function_span(source: str, name: str) -> tuple[int, int]:
    """Character offsets ``[start, end)`` of a top-level function's text."""
    tree = ast.parse(source)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return starts[node.lineno - 1], starts[node.end_lineno]
    raise KeyError(f"no function {name!r}")


def apply_bug(source: str, bug: KnownBug) -> str:
    """The solution's text with ``bug`` applied; ``old`` must occur exactly
    once in the function, so a changed solution breaks loudly here."""
    start, end = function_span(source, bug.exercise)
    body = source[start:end]
    if body.count(bug.old) != 1:
        raise ValueError(f"{bug.exercise}/{bug.name}: {bug.old!r} occurs "
                         f"{body.count(bug.old)} times in the solution, expected once")
    return source[:start] + body.replace(bug.old, bug.new) + source[end:]


@cache
def buggy_modules(chapter: Chapter, root: Path = COURSE_ROOT) -> tuple[tuple[KnownBug, object], ...]:
    """Each known bug of ``chapter`` as a module built from the mutated solution."""
    solution = (root / "solutions" / f"{chapter.module}.py").read_text(encoding="utf-8")
    modules = []
    for bug in KNOWN_BUGS.get(chapter.id, ()):
        module = types.ModuleType(f"{chapter.module}__{bug.exercise}__{bug.name}")
        exec(compile(apply_bug(solution, bug), module.__name__, "exec"), module.__dict__)
        modules.append((bug, module))
    return tuple(modules)


class Lookalikes:
    """The outputs of every known bug for one call, computed on demand.

    ``part(i)`` selects item ``i`` of tuple outputs; the result is what
    ``compare.expect_close`` takes as ``bugs``.
    """

    def __init__(self, chapter: Chapter, function: str, args: tuple, kwargs: dict,
                 exercise: str | None = None):
        self.chapter, self.function = chapter, function
        self.args, self.kwargs = args, kwargs
        self.exercise = exercise or function

    def __call__(self) -> Iterator[tuple[str, object]]:
        return self._outputs(None)

    def part(self, index: int):
        return lambda: self._outputs(index)

    def _outputs(self, index: int | None) -> Iterator[tuple[str, object]]:
        # The exercise's own bugs first: they are the likelier explanation.
        ordered = sorted(buggy_modules(self.chapter), key=lambda pair: pair[0].exercise != self.exercise)
        for bug, module in ordered:
            try:
                output = getattr(module, self.function)(*_cloned(self.args), **_cloned(self.kwargs))
                yield bug.hint, output if index is None else output[index]
            except Exception:  # a bug that cannot run on these inputs explains nothing
                continue


def _cloned(values):
    if isinstance(values, dict):
        return {key: _cloned(value) for key, value in values.items()}
    if isinstance(values, (tuple, list)):
        return type(values)(_cloned(value) for value in values)
    if isinstance(values, torch.Tensor):
        return values.detach().clone()
    return values.copy() if hasattr(values, "copy") else values


class KnownBugs:
    """The ``bugs`` fixture: ``bugs.softmax(x, dim=0)`` gives its Lookalikes."""

    def __init__(self, chapter: Chapter):
        self.chapter = chapter

    def __getattr__(self, function: str):
        if function.startswith("_"):
            raise AttributeError(function)
        return lambda *args, **kwargs: Lookalikes(self.chapter, function, args, kwargs)
