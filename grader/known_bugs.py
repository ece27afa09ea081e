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
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from functools import cache
from pathlib import Path
from typing import TypeVar

import torch

from grader.bugs import KnownBug, known_bugs_catalog
from grader.catalog import COURSE_ROOT, Chapter
from grader.module_calls import ModuleCall, run_module_call

class _Catalog(MutableMapping):
    """``{chapter id: its bugs}``, read from ``grader/bugs`` on first use.

    Not at import: a grading process forks the server its workers come
    from before its checks first ask for a bug, so the catalog's edited
    solution lines are never in a worker's memory (Gradescope, where
    student code could read its own memory out and print it)."""

    def __init__(self):
        self._bugs: dict[str, tuple[KnownBug, ...]] | None = None

    def _loaded(self) -> dict[str, tuple[KnownBug, ...]]:
        if self._bugs is None:
            self._bugs = known_bugs_catalog()
        return self._bugs

    def __getitem__(self, chapter_id: str) -> tuple[KnownBug, ...]:
        return self._loaded()[chapter_id]

    def __setitem__(self, chapter_id: str, bugs: tuple[KnownBug, ...]) -> None:
        self._loaded()[chapter_id] = bugs

    def __delitem__(self, chapter_id: str) -> None:
        del self._loaded()[chapter_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())


KNOWN_BUGS = _Catalog()
Item = TypeVar("Item")


def function_span(source: str, name: str) -> tuple[int, int]:
    """Character offsets ``[start, end)`` of a top-level function's or class's text."""
    tree = ast.parse(source)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
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
    solution = chapter.solution(root).read_text(encoding="utf-8")
    modules = []
    for bug in KNOWN_BUGS.get(chapter.id, ()):
        module = types.ModuleType(f"{chapter.module}__{bug.exercise}__{bug.name}")
        exec(compile(apply_bug(solution, bug), module.__name__, "exec"), module.__dict__)
        modules.append((bug, module))
    return tuple(modules)


def seen_first(bugs: Iterable[Item], hint_of: Callable[[Item], str], seen: Sequence[str]) -> list[Item]:
    """``bugs`` with those whose hint an earlier check of the run matched
    first, each group in its own order. A student's slip shows in check after
    check: trying the bug already found first saves running every other one
    in each of those checks. The first match, and so the
    hint, is what the plain order gives whenever only one bug matches."""
    return sorted(bugs, key=lambda bug: hint_of(bug) not in seen)


class Lookalikes:
    """The outputs of every known bug for one call, computed on demand.

    ``part(i)`` selects item ``i`` of tuple outputs; the result is what
    ``compare.expect_close`` takes as ``bugs``. ``seen``: the hints earlier
    checks of this run matched (``seen_first``); it may grow meanwhile.
    """

    def __init__(self, chapter: Chapter, function: str, args: tuple, kwargs: dict,
                 exercise: str | None = None, module: ModuleCall | None = None,
                 seen: Sequence[str] = ()):
        self.chapter, self.function = chapter, function
        self.args, self.kwargs = args, kwargs
        # A module handed to a function (generate(model, ...)) is that function's call.
        self.exercise = exercise or (module.passed_to if module is not None and module.passed_to else function)
        self.module = module
        self.seen = seen

    def __call__(self) -> Iterator[tuple[str, object]]:
        return self._outputs(None)

    def part(self, index: int):
        return lambda: self._outputs(index)

    def _outputs(self, index: int | None) -> Iterator[tuple[str, object]]:
        for bug, output in self.outputs_by_bug(self.seen):
            try:
                yield bug.hint, output if index is None else output[index]
            except Exception:  # an output without that part explains nothing
                continue

    def outputs_by_bug(self, seen: Sequence[str] = ()) -> Iterator[tuple[KnownBug, object]]:
        """Each bug that runs on these inputs, with its whole output; with no
        ``seen``, in the order ``grader.recorded`` keeps for the student edition."""
        # The exercise's own bugs first: they are the likelier explanation.
        ordered = sorted(buggy_modules(self.chapter), key=lambda pair: pair[0].exercise != self.exercise)
        for bug, module in seen_first(ordered, lambda pair: pair[0].hint, seen):
            args, kwargs = _cloned(self.args), _cloned(self.kwargs)
            try:
                if self.module is None:
                    output = getattr(module, self.function)(*args, **kwargs)
                else:
                    output = run_module_call(module, self.function, self.module, args, kwargs)
            except Exception:  # a bug that cannot run on these inputs explains nothing
                continue
            yield bug, output


def _cloned(values):
    if isinstance(values, dict):
        return {key: _cloned(value) for key, value in values.items()}
    if isinstance(values, (tuple, list)):
        return type(values)(_cloned(value) for value in values)
    if isinstance(values, torch.Tensor):
        return values.detach().clone()
    return values.copy() if hasattr(values, "copy") else values


class KnownBugs:
    """The ``bugs`` fixture: ``bugs.softmax(x, dim=0)`` gives its Lookalikes,
    and ``bugs.module("MultiHeadAttention", recipe, x)`` those of a class.
    ``seen``: the hints earlier checks of the run matched (``seen_first``)."""

    def __init__(self, chapter: Chapter, seen: Sequence[str] = ()):
        self.chapter = chapter
        self.seen = seen

    def module(self, name: str, recipe: ModuleCall, *args, **kwargs) -> Lookalikes:
        return Lookalikes(self.chapter, name, args, kwargs, module=recipe, seen=self.seen)

    def __getattr__(self, function: str):
        if function.startswith("_"):
            raise AttributeError(function)
        return lambda *args, **kwargs: Lookalikes(self.chapter, function, args, kwargs, seen=self.seen)
