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
answer then says too little to tell them apart.

Each relation is a function ``(Mismatch) -> Found | None`` in ``RELATIONS``;
a chapter adds its own in ``grader/chapters/chNN/relations.py``
(``RELATIONS``, functions of the same kind, tried after these).
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

ENABLED = True  # off only to measure what relations change (bench/hints.py)
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
        """Elementwise: ``got`` within tolerance of ``expected`` (NaN equal to
        NaN, an infinity to the same infinity)."""
        if got.dtype == torch.bool or expected.dtype == torch.bool:
            return got == expected
        rtol = self.rtol if rtol is None else rtol
        finite = torch.isfinite(expected) & ((got - expected).abs() <= self.atol + rtol * expected.abs())
        return finite | (torch.isnan(got) & torch.isnan(expected)) | \
            (torch.isinf(got) & (got == expected))

    def all_close(self, got: torch.Tensor, expected: torch.Tensor, rtol: float | None = None) -> bool:
        return got.shape == expected.shape and bool(self.close(got, expected, rtol).all())

    @property
    def wrong(self) -> torch.Tensor:
        """Elementwise: where ``got`` is not within tolerance (same shapes only)."""
        return ~self.close(self.got, self.expected)


@dataclass(frozen=True)
class Found:
    """A relation that holds: its name and the sentence a student reads."""

    name: str
    hint: str


Relation = Callable[[Mismatch], "Found | None"]


def explain(got: object, expected: object, axes: Sequence[str] | None = None,
            rtol: float = 1e-4, atol: float = 1e-5, chapter: str | None = None) -> Found | None:
    """The relations between a wrong answer and the expected one, as one
    ``Found`` (names joined by "+", sentences by "; or "), or None where
    none holds, where more than two do, or where the values are not arrays
    (or numbers) of a size worth examining."""
    if not ENABLED:
        return None
    mismatch = _mismatch(got, expected, axes, rtol, atol)
    if mismatch is None:
        return None
    found: list[Found] = []
    for relation in (*RELATIONS, *chapter_relations(chapter)):
        try:
            result = relation(mismatch)
        except (RuntimeError, ValueError, IndexError):  # a transform this shape does not allow
            result = None
        if result is not None and result.name not in {one.name for one in found}:
            found.append(result)
    if not found or len(found) > 2:
        return None
    return Found("+".join(one.name for one in found), "; or ".join(one.hint for one in found))


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
    if (got_t.dtype == torch.bool) != (expected_t.dtype == torch.bool) or expected_t.numel() == 0:
        return None
    names = tuple(axes or ())
    dims = expected_t.dim()
    named = tuple(f"dim {index - dims}" for index in range(dims - len(names))) + names[-dims:] if dims else ()
    return Mismatch(got_t, expected_t, named, rtol, atol)


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
    """A factor as a student reads it: 2.83 (sqrt 8), 0.125 (1/8)."""
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
    if float((e * e).sum()) == 0.0 or int((e != 0).sum()) < 1:
        return None
    c = float((g * e).sum() / (e * e).sum())
    if c == 0.0 or math.isclose(c, 1.0, rel_tol=FITTED_RTOL) or not mismatch.all_close(g, c * e, FITTED_RTOL):
        return None
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
    for order in _permutations(mismatch):
        if mismatch.all_close(mismatch.got, mismatch.expected.permute(order)):
            moved = [dim for dim in range(len(order)) if order[dim] != dim]
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


def triangle(mismatch: Mismatch) -> Found | None:
    """Only the entries above, below or on the diagonal of the last two axes differ."""
    expected = mismatch.expected
    # Queries against keys: at least as many columns as rows (a causal mask's shape).
    if not mismatch.same_shape or expected.dim() < 2 or not 2 <= expected.shape[-2] <= expected.shape[-1]:
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
    return None


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


RELATIONS: tuple[Relation, ...] = (inverted, factor, transposed, rearranged, shifted, edge, triangle,
                                   normalized_over, scale, log, masked, narrowed, nan_rows)
NAMES = ("inverted", "factor", "transposed", "rearranged", "shifted", "edge", "diagonal", "future", "past",
         "normalized_over", "scale", "log", "masked", "narrowed", "nan_rows", "roles")
