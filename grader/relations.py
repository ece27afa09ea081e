"""Name a mistake nobody catalogued, from how the wrong answer relates to the right one.

A known bug's hint (``grader.known_bugs``) comes from running the bug on
the check's inputs. A mistake outside the catalog can still leave a mark
on the answer that says what it is: weights that sum to 1 over the queries
instead of the keys, an output one position late, a mask with True and
False swapped. When a value fails its comparison and no known bug explains
it, ``explain`` tests the wrong value (``got``) against transforms of the
expected one, computed here from the expected answer alone (so they work
as well in the student edition, which replays recorded answers), and
returns the sentence of each relation that holds.

A wrong hint is worse than none. A relation is named only when it explains
every entry within the check's tolerance (or, for a fitted constant, within
a tolerance a little looser than the check's, given below); where two
explain the answer, both are named; where more do, none is, since the
answer then says too little to tell them apart. And it is named only where
the exercise's failed comparisons agree on it (``held``): one input can
make a mistake look like another (a factor at position 1, a permutation at
position 0). A known bug's hint keeps its priority over them all
(``check_runner``).

Each relation is a function ``(Mismatch) -> Found | None`` in ``RELATIONS``;
a chapter adds its own in ``grader/chapters/chNN/relations.py``
(``RELATIONS``, functions of the same kind, tried after these).

Some mistakes are of what goes in, not of what comes out: q and k
exchanged, the mask left out or read the other way round. Their answers
are the reference's on changed inputs (``variants``), which the known-bug
machinery runs after the catalog's bugs, as lookalikes of lower priority
(``known_bugs.Lookalikes``; recorded for the student edition as the bugs
are), with a ``RelationHint``.
"""

from __future__ import annotations

import importlib
import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from grader.compare import RelationHint, RelationHints, close_mask

ENABLED = True  # off only to measure what relations change (bench/hints.py)
EDIT = "edit"  # the name of ``grader.edits``' hints
LARGEST = 1 << 16  # entries: a larger answer is not examined (its comparison says enough)
FITTED_RTOL = 1e-3  # for a relation with a fitted constant (a factor, a temperature)


@dataclass(frozen=True)
class Mismatch:
    """A value that failed its comparison, and the expected one.

    ``got`` and ``expected`` are float64 (or bool) tensors on the CPU; their
    shapes may differ (a shape mismatch). ``axes`` names each axis of
    ``expected`` ("queries", "keys"; "dim -1" where the check gave none).
    ``rtol`` and ``atol`` are the check's tolerance.
    """

    got: torch.Tensor
    expected: torch.Tensor
    axes: tuple[str, ...]
    rtol: float
    atol: float

    @property
    def same_shape(self) -> bool:
        return self.got.shape == self.expected.shape

    def close(self, got: torch.Tensor, expected: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
        """Elementwise: ``got`` within tolerance of ``expected``, as the checks
        compare (``compare.close_mask``), NaN equal to NaN."""
        return close_mask(got, expected, self.rtol if rtol is None else rtol, self.atol, equal_nan=True)

    def all_close(self, got: torch.Tensor, expected: torch.Tensor, rtol: float | None = None) -> bool:
        return got.shape == expected.shape and bool(self.close(got, expected, rtol).all())

    @property
    def wrong(self) -> torch.Tensor:
        """Elementwise: where ``got`` is not within tolerance (same shapes only)."""
        return ~self.close(self.got, self.expected)


def found_in(related: RelationHints) -> list[Found]:
    """Each of a comparison's ``compare.RelationHints`` as a relation that
    holds; an edit's sentence is its detail, since the checks must agree on
    the very edit."""
    return [Found(hint.name, str(hint), detail=str(hint) if hint.name == EDIT else "") for hint in related.hints]


class Seen(list):
    """The known bugs' hints earlier checks of a run matched, first first
    (``known_bugs.seen_first``), and ``edits_left``: the edits of the
    reference (``grader.edits``, by sentence) that the exercise being
    checked can still have named, None before any of its comparisons holds
    anything. ``held`` names an edit only where every comparison that holds
    something holds it, so an edit outside ``edits_left`` need not run."""

    edits_left: frozenset[str] | None = None
    edits_tried: int = 0  # calls whose edits ran: a check that ran them and matched none missed them


def edits_to_try(seen: Sequence[str]) -> Callable[[str], bool]:
    """Count one try of the edits of the reference for a call (where
    ``seen`` is a run's ``Seen``) and say, by an edit's sentence, whether
    it is one the exercise can still name (all of them, for any other
    ``seen``)."""
    left = seen.edits_left if isinstance(seen, Seen) else None
    if isinstance(seen, Seen):
        seen.edits_tried += 1
    return lambda hint: left is None or str(hint) in left


@dataclass(frozen=True)
class Found:
    """A relation that holds: its name and the sentence a student reads.
    ``detail``: what the checks of an exercise must agree on besides the
    name (the factor of a number: any number is some multiple of another)."""

    name: str
    hint: str
    detail: str = ""

    @property
    def key(self) -> str:
        return f"{self.name}:{self.detail}" if self.detail else self.name


Relation = Callable[[Mismatch], "Found | None"]


def examine(got: object, expected: object, axes: Sequence[str] | None = None,
            rtol: float = 1e-4, atol: float = 1e-5, chapter: str | None = None) -> list[Found] | None:
    """Every relation that holds between a wrong answer and the expected
    one (the chapter's own last), possibly none; None where the values are
    not arrays (or numbers) of a size worth examining, or differ only in
    their dtype."""
    if not ENABLED:
        return None
    mismatch = _mismatch(got, expected, axes, rtol, atol)
    if mismatch is None:
        return None
    if mismatch.all_close(mismatch.got, mismatch.expected):  # the values: only the dtype differs
        return [Found("dtype", f"your values are right; only their dtype differs ({_dtype(got)}, expected "
                               f"{_dtype(expected)}): what made it change, a cast or a tensor made without dtype=?")]
    found: list[Found] = []
    for relation in (*RELATIONS, *chapter_relations(chapter)):
        try:
            result = relation(mismatch)
        except (RuntimeError, ValueError, IndexError):  # a transform this shape does not allow
            result = None
        if result is not None and result.name not in {one.name for one in found}:
            found.append(result)
    return found


def said(found: Sequence[Found]) -> Found | None:
    """One ``Found`` for what holds (names joined by "+", sentences by "; or
    "): None where nothing does, or more than two relations do, since the
    answer then says too little to tell them apart. Where more than two
    hold with edits of the reference among them (several edits of one line
    can give one answer), the relations alone are said if they are one or
    two: what the answer is (the scores d times too large) is true of all."""
    if len(found) > 2:
        found = [one for one in found if one.name != EDIT]
    if not found or len(found) > 2:
        return None
    return Found("+".join(one.name for one in found), "; or ".join(one.hint for one in found))


def held(found: Sequence[set[str]], edits_tried: Sequence[bool] | None = None) -> set[str]:
    """The relations an exercise's failed comparisons agree on, from the
    keys (``Found.key``) of each one's relations (``found``, one set a comparison): those
    that at least half of them hold, and that no comparison contradicts by
    holding others without them. A comparison that holds none does not
    contradict: the mistake may leave no mark on that check's inputs.
    An edit of the reference (``grader.edits``) is judged by the comparisons
    that tried the edits only (``edits_tried``, one flag a comparison): a
    property of the answer (rows that sum to 1) has no edit to give."""
    tried = list(edits_tried) if edits_tried is not None else [True] * len(found)
    counts: dict[str, int] = {}
    for names in found:
        for name in names:
            counts[name] = counts.get(name, 0) + 1

    def agreed(name: str, count: int) -> bool:
        judges = [names for names, was in zip(found, tried) if was or not name.startswith(f"{EDIT}:")]
        return 2 * count >= len(judges) and all(name in names for names in judges if names)
    return {name for name, count in counts.items() if agreed(name, count)}


def explain(got: object, expected: object, axes: Sequence[str] | None = None,
            rtol: float = 1e-4, atol: float = 1e-5, chapter: str | None = None) -> Found | None:
    """What ``said`` makes of ``examine``'s relations: one answer alone."""
    return said(examine(got, expected, axes, rtol, atol, chapter) or ())


def _mismatch(got: object, expected: object, axes: Sequence[str] | None, rtol: float,
              atol: float) -> Mismatch | None:
    values = []
    for value in (got, expected):
        if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
            value = torch.tensor(value, dtype=torch.bool if isinstance(value, bool) else torch.float64)
        elif isinstance(value, np.ndarray):
            if value.dtype.kind not in "biuf":
                return None
            value = torch.from_numpy(np.ascontiguousarray(value))
        if not isinstance(value, torch.Tensor) or value.is_complex() or value.numel() > LARGEST:
            return None
        value = value.detach().cpu()
        values.append(value if value.dtype == torch.bool else value.to(torch.float64))
    got_t, expected_t = values
    if expected_t.numel() == 0:
        return None
    if (got_t.dtype == torch.bool) != (expected_t.dtype == torch.bool):  # a mask of 0s and 1s: as numbers
        got_t, expected_t = got_t.to(torch.float64), expected_t.to(torch.float64)
    names = tuple(axes or ())
    dims = expected_t.dim()
    named = tuple(f"dim {index - dims}" for index in range(dims - len(names))) + names[-dims:] if dims else ()
    return Mismatch(got_t, expected_t, named, rtol, atol)


def _dtype(value: object) -> str:
    dtype = getattr(value, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else type(value).__name__


@cache
def chapter_relations(chapter: str | None) -> tuple[Relation, ...]:
    """A chapter's own relations (``grader/chapters/chNN/relations.py``), if it has any."""
    if chapter is None:
        return ()
    name = f"grader.chapters.{chapter}.relations"
    try:
        return tuple(importlib.import_module(name).RELATIONS)
    except ModuleNotFoundError as error:
        if error.name != name:
            raise
        return ()


# -- words ------------------------------------------------------------------------------


def _number(value: float) -> str:
    """A factor as a student reads it: "2.828 (sqrt(8))", "0.125 (1/8)", "3"."""
    for n in range(2, 4097):
        for text, candidate in ((f"{n}", n), (f"1/{n}", 1 / n), (f"sqrt({n})", math.sqrt(n)),
                                (f"1/sqrt({n})", 1 / math.sqrt(n))):
            if math.isclose(abs(value), candidate, rel_tol=FITTED_RTOL) and not (
                    text.startswith(("sqrt", "1/sqrt")) and math.isqrt(n) ** 2 == n):
                sign = "-" if value < 0 else ""
                return f"{sign}{text}" if text == f"{n}" else f"{value:.4g} ({sign}{text})"
    return f"{value:.4g}"


def _axis(mismatch: Mismatch, dim: int) -> str:
    name = mismatch.axes[dim]
    return name if name.startswith("dim ") else f"the {name} (dim {dim - mismatch.expected.dim()})"


# -- the relations --------------------------------------------------------------------------


def inverted(mismatch: Mismatch) -> Found | None:
    """A boolean answer with True and False exchanged everywhere."""
    if mismatch.expected.dtype != torch.bool or not mismatch.same_shape:
        return None
    if bool((mismatch.got == ~mismatch.expected).all()):
        return Found("inverted", "your answer is the expected one with True and False swapped everywhere: "
                                 "which of the two means \"may attend\" (or \"keep\") here?")
    return None


def factor(mismatch: Mismatch) -> Found | None:
    """Every entry the expected one times one constant."""
    got, expected = mismatch.got, mismatch.expected
    if got.dtype == torch.bool or not mismatch.same_shape:
        return None
    finite = torch.isfinite(expected)
    if not bool((torch.isfinite(got) == finite).all()) or not bool(finite.any()):
        return None
    g, e = got[finite], expected[finite]
    # A number (a count) may be a multiple; of an array, one entry says nothing of "every entry".
    if int((e != 0).sum()) < (1 if expected.dim() == 0 else 2):
        return None
    c = float((g * e).sum() / (e * e).sum())
    if abs(c) < 1e-3 or math.isclose(c, 1.0, rel_tol=FITTED_RTOL) or not mismatch.all_close(g, c * e, FITTED_RTOL):
        return None  # about 0: an answer of zeros is no multiple of anything
    if expected.dim() == 0:  # a number is a multiple of any other: only a whole one (or its inverse) says much
        whole = round(c) if abs(c) >= 1 else round(1 / c)
        if abs(whole) < 2 or not math.isclose(c if abs(c) >= 1 else 1 / c, whole, rel_tol=1e-9):
            return None
        return Found("factor", f"your answer is {_number(c)} times the expected one: something counted "
                               f"{'too many' if abs(c) > 1 else 'too few'} times (or a size in the wrong unit)?",
                     detail=_number(c))
    if math.isclose(c, -1.0, rel_tol=FITTED_RTOL):
        return Found("factor", "your answer is the expected one with the opposite sign, everywhere")
    return Found("factor", f"every entry of your answer is the expected one times {_number(c)}: "
                           f"a constant factor (a scale, a mean where a sum belongs, or the reverse)")


def _permutations(mismatch: Mismatch):
    """Each reordering of the expected answer's axes that gives ``got``'s shape."""
    expected = mismatch.expected
    if expected.dim() < 2 or expected.dim() > 5:
        return
    for order in itertools.permutations(range(expected.dim())):
        if list(order) != sorted(order) and tuple(expected.shape[i] for i in order) == tuple(mismatch.got.shape):
            yield order


def transposed(mismatch: Mismatch) -> Found | None:
    """The expected answer with its axes swapped or reordered."""
    expected = mismatch.expected
    if expected.numel() < 4 or bool((expected == expected.flatten()[0]).all()):
        return None  # too small or constant: every order of the axes gives it
    for order in _permutations(mismatch):
        moved = [dim for dim in range(len(order)) if order[dim] != dim]
        if sum(expected.shape[dim] > 1 for dim in moved) < 2:
            continue  # an axis of size 1 moved: a reshape, not a transpose
        if mismatch.all_close(mismatch.got, expected.permute(order)):
            if len(moved) == 2:
                a, b = moved
                return Found("transposed", f"your answer is the expected one with {_axis(mismatch, a)} and "
                                           f"{_axis(mismatch, b)} swapped (transposed)")
            return Found("transposed", "your answer holds the expected values with the axes in another "
                                       f"order: dims {tuple(d - len(order) for d in order)} of the expected one")
    return None


def rearranged(mismatch: Mismatch) -> Found | None:
    """Every expected value, in other places (and no transpose explains it)."""
    got, expected = mismatch.got, mismatch.expected
    if expected.dtype == torch.bool or got.numel() != expected.numel() or expected.numel() < 4:
        return None
    if not bool(torch.isfinite(expected).all()) or not bool(torch.isfinite(got).all()):
        return None
    if torch.unique(expected).numel() < 0.9 * expected.numel():  # repeated values: a weak sign
        return None
    if any(mismatch.all_close(got, expected.permute(order)) for order in _permutations(mismatch)):
        return None
    if not mismatch.all_close(got.flatten().sort().values, expected.flatten().sort().values):
        return None
    shape = "" if mismatch.same_shape else f" (in shape {tuple(got.shape)})"
    return Found("rearranged", f"your answer holds every expected value, but in other places{shape}: "
                               f"a reshape or view where a transpose or permute belongs, or the "
                               f"axes split or merged in the wrong order?")


def shifted(mismatch: Mismatch) -> Found | None:
    """The expected answer moved one position along an axis."""
    got, expected = mismatch.got, mismatch.expected
    if not mismatch.same_shape:
        return None
    for dim in range(expected.dim()):
        n = expected.shape[dim]
        if n < 3:
            continue
        head, tail = expected.narrow(dim, 0, n - 1), expected.narrow(dim, 1, n - 1)
        if mismatch.all_close(head, tail):  # constant along this axis: a shift says nothing
            continue
        if mismatch.all_close(got.narrow(dim, 1, n - 1), head):
            return Found("shifted", f"your answer is the expected one moved one position later along "
                                    f"{_axis(mismatch, dim)}: an index or position off by one?")
        if mismatch.all_close(got.narrow(dim, 0, n - 1), tail):
            return Found("shifted", f"your answer is the expected one moved one position earlier along "
                                    f"{_axis(mismatch, dim)}: an index or position off by one?")
    return None


def edge(mismatch: Mismatch) -> Found | None:
    """Only the first or the last position along one axis differs."""
    if not mismatch.same_shape or mismatch.expected.dim() == 0:
        return None
    wrong = mismatch.wrong
    if int(wrong.sum()) < 2:
        return None
    places = []
    for dim in range(wrong.dim()):
        n = wrong.shape[dim]
        if n < 3:
            continue
        at = wrong.nonzero()[:, dim]
        for index, word in ((0, "first"), (n - 1, "last")):
            if bool((at == index).all()):
                places.append((dim, word))
    if len(places) != 1:
        return None
    dim, word = places[0]
    return Found("edge", f"only the {word} position along {_axis(mismatch, dim)} is wrong, all the others "
                         f"are right: does a loop or a slice miss it, or treat it apart?")


def _diagonals(mismatch: Mismatch):
    """``(offset, rows, columns)`` of the last two axes: the diagonal
    ``j = i + offset``, for the offsets a causal mask may take."""
    rows, columns = mismatch.expected.shape[-2:]
    i = torch.arange(rows)[:, None]
    j = torch.arange(columns)[None, :]
    for offset in dict.fromkeys((0, columns - rows)):
        yield offset, i, j


def _queries_and_keys(mismatch: Mismatch) -> bool:
    """Whether the last two axes are queries against keys: so named, or the
    answer is a mask or scores with -inf."""
    expected = mismatch.expected
    return (mismatch.axes[-2:] == ("queries", "keys") or expected.dtype == torch.bool
            or bool(torch.isneginf(expected).any()))


def triangle(mismatch: Mismatch) -> Found | None:
    """Only the entries above, below or on the diagonal of the last two axes differ."""
    expected = mismatch.expected
    # Queries against keys: at least as many columns as rows (a causal mask's shape).
    if not mismatch.same_shape or expected.dim() < 2 or not 2 <= expected.shape[-2] <= expected.shape[-1]:
        return None
    if not _queries_and_keys(mismatch):
        return None
    wrong = mismatch.wrong
    places = wrong.reshape(-1, *wrong.shape[-2:]).any(0).nonzero()
    if places[:, 0].unique().numel() < 2 or places[:, 1].unique().numel() < 2:
        return None  # one row or one column: ``edge`` says it, a triangle would not
    where = _axis(mismatch, -1 + mismatch.expected.dim())
    for offset, i, j in _diagonals(mismatch):
        for name, part, sentence in (
                ("diagonal", j == i + offset, "only the diagonal differs (each position's own entry): is the "
                                              "diagonal included where it should be excluded, or the reverse "
                                              "(< where <= belongs)?"),
                ("future", j > i + offset, "only the entries above the diagonal differ (later positions along "
                                           f"{where}): is the causal mask missing there, or built the wrong way?"),
                ("past", j < i + offset, "only the entries below the diagonal differ (earlier positions along "
                                         f"{where}): is the mask built the wrong way round (triu for tril)?")):
            if not bool((wrong & ~part).any()):
                return Found(name, sentence)
    return None


def _distribution(values: torch.Tensor, dim: int) -> bool:
    """Non-negative and summing to 1 along ``dim`` (within float32's rounding)."""
    return (values.shape[dim] > 1 and bool(torch.isfinite(values).all()) and bool((values >= 0).all())
            and bool(((values.sum(dim) - 1).abs() <= 1e-4).all()))


def normalized_over(mismatch: Mismatch) -> Found | None:
    """Sums to 1 along another axis than the expected answer does."""
    got, expected = mismatch.got, mismatch.expected
    if got.dtype == torch.bool or not mismatch.same_shape or expected.dim() < 2:
        return None
    own = [dim for dim in range(expected.dim()) if _distribution(expected, dim)]
    if len(own) != 1 or _distribution(got, own[0]) or not bool(((got > 0) == (expected > 0)).all()):
        return None  # a normalisation elsewhere keeps what is zero zero, and only that
    other = [dim for dim in range(got.dim()) if _distribution(got, dim)]
    if len(other) == 1:
        return Found("normalized_over", f"your values sum to 1 over {_axis(mismatch, other[0])}, not over "
                                        f"{_axis(mismatch, own[0])}: a softmax (or a division by a sum) "
                                        f"along the wrong dim?")
    if not other and bool(torch.isfinite(got).all()) and expected.numel() > expected.shape[own[0]]:
        total = got.sum()
        if math.isclose(float(total), 1.0, rel_tol=1e-4):
            return Found("normalized_over", f"your values sum to 1 over everything, not over each "
                                            f"slice along {_axis(mismatch, own[0])}: a softmax (or a "
                                            f"division by a sum) without its dim?")
    return None


def scale(mismatch: Mismatch) -> Found | None:
    """A softmax of the right scores times a constant: the temperature is off."""
    got, expected = mismatch.got, mismatch.expected
    if got.dtype == torch.bool or not mismatch.same_shape or expected.dim() < 1:
        return None
    dim = expected.dim() - 1
    if not _distribution(expected, dim) or not _distribution(got, dim):
        return None
    support = expected > 0
    if not bool(((got > 0) == support).all()):
        return None
    log_e = torch.where(support, expected.log(), torch.zeros_like(expected))
    log_g = torch.where(support, got.log(), torch.zeros_like(got))
    count = support.sum(dim, keepdim=True).clamp(min=1)
    centered_e = torch.where(support, log_e - log_e.sum(dim, keepdim=True) / count, torch.zeros_like(log_e))
    centered_g = torch.where(support, log_g - log_g.sum(dim, keepdim=True) / count, torch.zeros_like(log_g))
    spread = float((centered_e * centered_e).sum())
    if spread < 1e-6:
        return None  # uniform weights: every temperature gives them
    t = float((centered_e * centered_g).sum()) / spread
    if t <= 0 or math.isclose(t, 1.0, rel_tol=FITTED_RTOL):
        return None
    powered = torch.where(support, expected.clamp(min=1e-300) ** t, torch.zeros_like(expected))
    if not mismatch.all_close(got, powered / powered.sum(dim, keepdim=True), FITTED_RTOL):
        return None
    which = ("sharper: is the scale (1/sqrt(d_k)) missing, or multiplied where it should divide?" if t > 1 else
             "flatter: is the scale applied twice, or d_k used where sqrt(d_k) belongs?")
    return Found("scale", f"your weights are a softmax of the right scores times {_number(t)}, {which}")


def log(mismatch: Mismatch) -> Found | None:
    """The logarithm of the expected answer."""
    got, expected = mismatch.got, mismatch.expected
    if got.dtype == torch.bool or not mismatch.same_shape or not bool((expected >= 0).all()):
        return None
    if not bool((expected > 0).any()) or not mismatch.all_close(got, expected.log(), FITTED_RTOL):
        return None
    return Found("log", "your answer is the logarithm of the expected one: log_softmax where softmax "
                        "belongs, or an exp left out?")


def masked(mismatch: Mismatch) -> Found | None:
    """Only masked positions differ: where the expected weight is 0 or the
    expected score -inf (weights renormalised over the others)."""
    got, expected = mismatch.got, mismatch.expected
    if got.dtype == torch.bool or not mismatch.same_shape or expected.dim() < 1:
        return None
    hidden = (expected == 0) | (expected == float("-inf"))
    if not bool(hidden.any()) or bool(hidden.all()):
        return None
    wrong = mismatch.wrong
    if not bool(wrong.any()) or bool(torch.isnan(got[wrong]).any()):  # NaN: ``nan_rows`` says it
        return None
    if not bool((wrong & ~hidden).any()):
        return Found("masked", "only the masked (or padded) positions differ, where the expected answer "
                               "has 0 or -inf: is the mask applied, and applied last?")
    dim = expected.dim() - 1  # weights: the mask ignored, the rest renormalised
    if bool((expected >= 0).all()) and _distribution(expected, dim) and _distribution(got, dim) and \
            bool((got[hidden] > mismatch.atol).any()):
        kept = torch.where(hidden, torch.zeros_like(got), got)
        total = kept.sum(dim, keepdim=True)
        if bool((total > 0).all()) and mismatch.all_close(kept / total, expected, FITTED_RTOL):
            if expected.dim() >= 2 and any(bool((hidden == (j > i + offset)).all())
                                           for offset, i, j in _diagonals(mismatch)):
                return Found("masked", "your weights give weight to later positions (the future, where the "
                                       "expected ones are 0), and are right up to that: is the causal mask "
                                       "applied before the softmax?")
            return Found("masked", "your weights give weight to the masked positions (where the expected ones "
                                   "are 0), and are right up to that: is the mask applied before the softmax?")
    return None


def narrowed(mismatch: Mismatch) -> Found | None:
    """Every entry a float16 (or bfloat16) number, close to the expected one
    at that precision: computed in a narrower dtype."""
    got, expected = mismatch.got, mismatch.expected
    if got.dtype == torch.bool or not mismatch.same_shape or expected.numel() < 4:
        return None
    finite = torch.isfinite(got)
    if not bool(finite.any()):
        return None
    # bfloat16 first: its numbers are float16 numbers too, within float16's range.
    for dtype, name, rtol, atol in ((torch.bfloat16, "bfloat16", 2e-2, 1e-2), (torch.float16, "float16", 1e-2, 1e-3)):
        def exact(values: torch.Tensor) -> torch.Tensor:
            return values.to(dtype).to(torch.float64) == values

        if not bool(exact(got[finite]).all()) or float(exact(expected[torch.isfinite(expected)]).double().mean()) > 0.5:
            continue
        close = (got - expected).abs() <= atol + rtol * expected.abs()
        if bool((close | (torch.isnan(got) & torch.isnan(expected)) | (got == expected)).all()):
            return Found("narrowed", f"every entry of your answer is a {name} number, and agrees with the "
                                     f"expected one only to {name}'s precision: is something computed in "
                                     f"{name} and cast back?")
    return _rounded_inside(mismatch)


def _rounded_inside(mismatch: Mismatch) -> Found | None:
    """Off by no more than float16's rounding, made inside and carried on in
    float32: every entry within a few float16 epsilons of the expected one
    (relative to the entry and the answer's scale), the errors of either
    sign and of many sizes. A formula changed gives errors of one sign, or
    of a few sizes, or larger; an approximation (GELU's tanh form) can give
    these too, and the hint names it beside a narrower dtype."""
    got, expected = mismatch.got, mismatch.expected
    if not bool(torch.isfinite(got).all()) or not bool(torch.isfinite(expected).all()) or expected.numel() < 8:
        return None
    error = got - expected
    size = expected.abs().mean()
    eps = torch.finfo(torch.float16).eps  # bfloat16's, 8 times larger, would take in real mistakes
    if float(size) == 0.0 or not bool((error.abs() <= 4 * eps * (expected.abs() + size)).all()):
        return None
    wrong = mismatch.wrong
    errors = error[wrong]
    # Of either sign against the entry's own: rounding neither grows nor shrinks the values.
    outward = float(((errors > 0) == (expected[wrong] > 0)).double().mean())
    if errors.numel() < 4 or not 0.2 <= outward <= 0.8 or errors.abs().unique().numel() < 0.75 * errors.numel():
        return None
    return Found("narrowed", "your answer agrees with the expected one only to about 3 significant digits, "
                            "float16's precision, with errors of either sign: is something computed in a "
                            "narrower dtype (float16, bfloat16) inside, or a function approximated (GELU's "
                            "tanh form)?")


def nan_rows(mismatch: Mismatch) -> Found | None:
    """NaN in whole rows (along the last axis), right everywhere else."""
    got, expected = mismatch.got, mismatch.expected
    if got.dtype == torch.bool or not mismatch.same_shape or expected.dim() < 1:
        return None
    nan = torch.isnan(got) & ~torch.isnan(expected)
    if not bool(nan.any()):
        return None
    rows = nan.all(-1, keepdim=True).expand_as(nan)
    # Rows the expected answer leaves 0: in this course, a query with no key to attend to.
    if not bool((nan == rows).all()) or bool(mismatch.wrong[~rows].any()) or not bool((expected[rows] == 0).all()):
        return None
    return Found("nan_rows", "NaN fills whole rows of your answer where the expected rows are 0, and the rest "
                             "is right: rows whose every key is masked? Softmax over only -inf is NaN; such "
                             "a row's weights (and output) should be 0")


def zeroed(mismatch: Mismatch) -> Found | None:
    """0 in whole rows (along the last axis) where the expected rows are
    not, right everywhere else."""
    got, expected = mismatch.got, mismatch.expected
    if got.dtype == torch.bool or not mismatch.same_shape or expected.dim() < 2:
        return None
    wrong = mismatch.wrong
    rows = wrong.any(-1, keepdim=True).expand_as(wrong)
    if not bool(wrong.any()) or bool(rows.all()) or not bool((got[rows] == 0).all()):
        return None
    count = int(wrong.any(-1).sum())
    return Found("zeroed", f"your answer is 0 in {count} whole row{'s' if count > 1 else ''} (along "
                           f"{_axis(mismatch, expected.dim() - 1)}) where the expected one is not, and right "
                           f"elsewhere: rows zeroed that should not be (any() where all() belongs)?")


RELATIONS: tuple[Relation, ...] = (inverted, factor, transposed, rearranged, shifted, edge, triangle,
                                   normalized_over, scale, log, masked, narrowed, nan_rows, zeroed)
# Every relation's name: those of RELATIONS' findings, "dtype" (``examine``) and the variants'.
NAMES = ("inverted", "factor", "transposed", "rearranged", "shifted", "edge", "diagonal", "future", "past",
         "normalized_over", "scale", "log", "masked", "narrowed", "nan_rows", "zeroed", "dtype", "roles",
         "sign", EDIT, "probabilities")  # the last: chapter 8's train, a softmax before the cross-entropy


# -- mistakes of what goes in: the reference on changed inputs --------------------------------


@dataclass(frozen=True)
class Variant:
    """A change of a call's inputs: the answer a student's code gives when it
    reads its arguments wrongly is the reference's answer to ``args`` and
    ``kwargs``."""

    hint: RelationHint
    args: tuple
    kwargs: dict

    @property
    def name(self) -> str:
        return self.hint.name


def _is_array(value: object) -> bool:
    return (isinstance(value, torch.Tensor) and value.is_floating_point()) or \
        (isinstance(value, np.ndarray) and value.dtype.kind == "f")


# A count a student may get one off: a length, a position, a number of tokens (not of heads).
_POSITIONAL = re.compile(r"pos|len|token|past|offset|start|step", re.IGNORECASE)


def _is_integers(value: object) -> bool:
    """An integer tensor of positions (or counts), not all zero."""
    return isinstance(value, torch.Tensor) and not value.is_floating_point() and value.dtype != torch.bool \
        and not value.is_complex() and value.numel() > 0 and bool((value != 0).any())


def _scaled_scores(places, value, changed) -> list[Variant]:
    """The call with the attention scores a constant times as large, for the
    scale mistakes: the queries' projection ``w_q`` (or the queries ``q``)
    multiplied by it, which multiplies every score. One head's width d comes
    from the queries' last axis, or from ``w_q``'s rows and a heads count."""
    labels = {label: where for label, where in places}
    where = next((labels[name] for name in ("w_q", "q", "query") if name in labels
                  and _is_array(value(labels[name])) and value(labels[name]).ndim >= 2), None)
    if where is None:
        return []
    given = value(where)
    heads = [value(labels[label]) for label in labels if "head" in label and type(value(labels[label])) is int
             and value(labels[label]) > 1]
    width = given.shape[0] if where == labels.get("w_q") else given.shape[-1]
    d = width // heads[0] if heads and where == labels.get("w_q") and width % heads[0] == 0 else width
    if d < 2:
        return []
    wrong = [(math.sqrt(d), f"sqrt(d) = {math.sqrt(d):.4g} times too large: is the scale 1/sqrt(d) missing?"),
             (float(d), f"d = {d} times too large: is the score multiplied by sqrt(d) where it should be "
                        f"divided by it?"),
             (1 / math.sqrt(d), f"sqrt(d) = {math.sqrt(d):.4g} times too small: is it divided by d instead of "
                                f"sqrt(d), or by sqrt(d) twice?")]
    wrong += [(1 / math.sqrt(count), f"sqrt({count}) times too small, for {count} heads: is it divided by the "
                                     f"square root of the model's width instead of one head's?") for count in heads]
    return [Variant(RelationHint(f"your answer is the right one with the attention scores {text}", "scale"),
                    *changed((where, given * factor))) for factor, text in wrong]


def variants(args: tuple, kwargs: dict, names: Sequence[str]) -> list[Variant]:
    """Each change of the call ``(args, kwargs)`` a relation names: two
    arrays of one shape exchanged ("roles"); an array or integer positions
    negated ("sign"); integer positions, or a length or a number of tokens,
    one more or one less ("shifted"); the attention scores scaled wrongly ("scale",
    ``_scaled_scores``); a mask left out, or a boolean one with True and False
    swapped, or ``causal=True`` left out ("masked", "inverted"). ``names``:
    the function's parameter names, for the positional arguments."""
    if not ENABLED:
        return []
    places = [(names[index] if index < len(names) else f"argument {index + 1}", index)
              for index in range(len(args))] + [(key, key) for key in kwargs]

    def value(where):
        return args[where] if isinstance(where, int) else kwargs[where]

    def changed(*changes) -> tuple[tuple, dict]:
        new_args, new_kwargs = list(args), dict(kwargs)
        for where, new in changes:
            if isinstance(where, int):
                new_args[where] = new
            else:
                new_kwargs[where] = new
        return tuple(new_args), new_kwargs

    found = []
    arrays = [(label, where) for label, where in places if _is_array(value(where))]
    for (one, a), (two, b) in itertools.combinations(arrays, 2):
        first, second = value(a), value(b)
        if first.shape == second.shape and first.dtype == second.dtype and not (first == second).all():
            found.append(Variant(RelationHint(
                f"your answer is the right one for {one} and {two} exchanged: does each argument play "
                f"its own part?", "roles"), *changed((a, second), (b, first))))
    found += _scaled_scores(places, value, changed)
    for label, where in places:
        given = value(where)
        if _is_array(given) or _is_integers(given):
            found.append(Variant(RelationHint(
                f"your answer is the right one for -{label}, {label} negated: a sign slip (a difference taken "
                f"the other way round, a rotation the other way)?", "sign"), *changed((where, -given))))
        if _is_integers(given) or (type(given) is int and given > 0 and _POSITIONAL.search(label)):
            for step, word in ((1, "+ 1"), (-1, "- 1")):
                found.append(Variant(RelationHint(
                    f"your answer is the right one for {label} {word}: positions (or a count) off by one?",
                    "shifted"), *changed((where, given + step))))
        if "mask" in label.lower() and given is not None:
            found.append(Variant(RelationHint(
                f"your answer is the right one without {label}, as if it were None: is the mask applied "
                f"(and is what applies it kept: masked_fill returns a new tensor)?", "masked"),
                *changed((where, None))))
            if isinstance(given, torch.Tensor) and given.dtype == torch.bool:
                found.append(Variant(RelationHint(
                    f"your answer is the right one for {label} with True and False swapped: which of the two "
                    f"means \"may attend\" (or \"keep\") here?", "inverted"), *changed((where, ~given))))
        if label in ("causal", "is_causal") and given is True:
            found.append(Variant(RelationHint(
                f"your answer is the right one with {label}=False: is the causal mask applied?", "masked"),
                *changed((where, False))))
    return found
