"""Judge what a submission returned, and say in one sentence what is wrong.

Checks call these helpers with the submission's value and the expected one.
A failure raises ``CheckFailure`` whose message names what was tried and what
differs, in the order a student should fix things: the kind of value, its
shape and dtype, NaN or infinity, then the values themselves (largest
error and where). When the value matches a known wrong implementation on the
same inputs, the failure carries that bug's hint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from grader.outcomes import Failure
from grader.wire import Foreign

# (rtol, atol) per dtype: |got - expected| <= atol + rtol * |expected|.
# Looser than torch.testing's float32 default: a correct student may sum in
# another order than the reference. float64 gets float32's: the course
# promises float32 accuracy for every input dtype (the precision rule in
# chapter 1's lesson), so llama's ``softmax(scores.float()).type_as(q)`` is
# correct; checks feed float64 to measure an answer finely, not to demand
# float64 arithmetic.
TOLERANCES = {
    torch.float64: (1e-4, 1e-5),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


@dataclass(frozen=True)
class Compared:
    """A wrong value and the expected one, as a check compared them:
    ``axes`` names the expected value's last axes ("queries", "keys"), if
    the check said; ``rtol`` and ``atol`` are its tolerance."""

    got: object
    expected: object
    axes: tuple[str, ...] = ()
    rtol: float = 0.0
    atol: float = 0.0
    edits_tried: bool = False  # whether the reference's edits (``grader.edits``) were run for it too


class RelationHint(str):
    """A hint a relation gave (``grader.relations``: a variant of the call,
    an edit of the reference), carrying the relation's ``name``; a known
    bug's hint is a plain ``str``, so that a grade tells them apart."""

    name: str

    def __new__(cls, text: str, name: str) -> RelationHint:
        hint = super().__new__(cls, text)
        hint.name = name
        return hint

    def __reduce__(self):
        return RelationHint, (str(self), self.name)


class RelationHints(str):
    """The relations' hints whose answers one answer matched, in ``hints``;
    which of them is named is settled once the exercise's checks have run
    (``check_runner``), by what they agree on."""

    hints: tuple[RelationHint, ...]

    def __new__(cls, hints: Sequence[RelationHint]) -> RelationHints:
        text = super().__new__(cls, "; or ".join(hints))
        text.hints = tuple(hints)
        return text

    def __reduce__(self):
        return RelationHints, (self.hints,)


@dataclass(frozen=True)
class Raised:
    """A call of the submission that raised: the call (``module``, the recipe
    of an ``nn.Module`` exercise's) and what it raised, ``"Type: message"``
    (``raised_text``), so that the edits of the reference that raise the
    same on the same inputs can name the slip (``grader.edits``)."""

    function: str
    args: tuple
    kwargs: dict
    module: object | None
    text: str


def raised_text(kind: str, message: str) -> str:
    """What an exception says, on one line, as a failure's message shows it."""
    return f"{kind}: {' '.join(message.split())}"


class CheckFailure(AssertionError):
    """A check's verdict against the submission.

    ``kind`` says what sort of failure it is (``outcomes.Failure``), so
    that reports can sum up an exercise.
    """

    def __init__(self, message: str, kind: Failure = Failure.MISMATCH, hint: str | None = None,
                 summary: str = "", compared: Compared | None = None, raised: Raised | None = None):
        super().__init__(message)
        self.message = message
        self.kind = Failure(kind)
        self.hint = hint  # "looks like ...": the known bug the value matches
        self.summary = summary  # what differed in a few words, for a table cell
        # The values compared, where no known bug's hint was found: a relation
        # between them may still name the mistake (``grader.relations``).
        self.compared = compared
        self.raised = raised  # where the submission's code raised: the call, and what


def fail(message: str, kind: Failure = Failure.MISMATCH, hint: str | None = None, summary: str = "") -> None:
    raise CheckFailure(message, kind, hint, summary)


class Noted(Exception):
    """A check that passes with something to tell: what only the worker
    could see (which reductions a call ran), shown beside the exercise's
    verdict and never costing a point."""

    def __init__(self, message: str, hint: str | None = None, moot_if_failed: bool = False):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.moot_if_failed = moot_if_failed


def note(message: str, hint: str | None = None, moot_if_failed: bool = False) -> None:
    """End the check as passed, with ``message`` (and ``hint``) as a note.
    ``moot_if_failed``: a note worth reading only once the exercise passes
    (what is not known of a call that fails anyway), left out of a failed
    exercise's row."""
    raise Noted(message, hint, moot_if_failed)


def shape_text(shape: Iterable[int]) -> str:
    """``(2, 3)``, and ``(5,)`` for one dimension, as Python writes tuples."""
    return str(tuple(int(size) for size in shape))


def describe(value: object) -> str:
    """A short, input-free description of a value: ``tensor (2, 3) float32``."""
    if isinstance(value, torch.Tensor):
        where = "" if value.device.type == "cpu" else f" on {value.device}"
        return f"tensor {shape_text(value.shape)} {str(value.dtype).removeprefix('torch.')}{where}"
    if isinstance(value, np.ndarray):
        return f"array {shape_text(value.shape)} {value.dtype}"
    if isinstance(value, Foreign):
        return f"a {value.type_name}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, str):
        return f"the string {value[:30]!r}"
    return repr(value) if isinstance(value, (bool, int, float, type(None))) else type(value).__name__


def brief(value: object) -> str:
    """Shape, plus dtype and device where they are not the usual ones:
    ``(2, 5, 8)``, ``(5, 7) bool``, ``(3, 4) float64``."""
    if isinstance(value, torch.Tensor):
        text = shape_text(value.shape)
        if value.dtype != torch.float32:
            text += " " + str(value.dtype).removeprefix("torch.")
        return text if value.device.type == "cpu" else f"{text} on {value.device}"
    if isinstance(value, np.ndarray):
        return shape_text(value.shape) + ("" if value.dtype == np.float64 else f" {value.dtype}")
    return describe(value)


def _kind(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return "a torch.Tensor"
    if isinstance(value, np.ndarray):
        return "a NumPy array"
    if value is None:
        return "None"
    return describe(value)


def unpack(got: object, names: Sequence[str], what: str) -> tuple:
    """Split a returned tuple into its parts, failing if it is not one."""
    if not isinstance(got, (tuple, list)) or len(got) != len(names):
        expected = f"a tuple ({', '.join(names)})"
        if got is None:
            fail(f"{what} returned None, expected {expected}: is a return statement missing?")
        fail(f"{what} returned {describe(got)}, expected {expected}")
    return tuple(got)


def _as_tensor(value: torch.Tensor | np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(value)) if isinstance(value, np.ndarray) else value


def _index_text(flat_index: int, shape: Sequence[int]) -> str:
    if not shape:
        return ""
    return " at [" + ", ".join(str(int(i)) for i in np.unravel_index(flat_index, tuple(shape))) + "]"


def expect_like(got: object, expected: torch.Tensor | np.ndarray, what: str) -> None:
    """Same kind of array, shape and dtype as ``expected``."""
    if got is None:
        fail(f"{what} returned None: is a return statement missing?", summary="returned None")
    for kind, name in ((np.ndarray, "a NumPy array"), (torch.Tensor, "a torch.Tensor")):
        if isinstance(expected, kind) and not isinstance(got, kind):
            fail(f"{what} returned {_kind(got)}, expected {name}",
                 summary=f"returned {_kind(got)}, not {name}")
    if tuple(got.shape) != tuple(expected.shape):
        shapes = f"shape {shape_text(got.shape)}, expected {shape_text(expected.shape)}"
        fail(f"{what} has {shapes}", summary=shapes)
    if got.dtype != expected.dtype:
        dtypes = f"dtype {got.dtype}, expected {expected.dtype}"
        fail(f"{what} has {dtypes}", summary=dtypes)


def _tolerance(dtype: torch.dtype, rtol: float | None = None,
               atol: float | None = None) -> tuple[float, float]:
    """``(rtol, atol)``: the dtype's, unless given; exact for integers and bools."""
    default_rtol, default_atol = TOLERANCES.get(dtype, (0.0, 0.0))
    return (default_rtol if rtol is None else rtol, default_atol if atol is None else atol)


def close_mask(got: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float,
               equal_nan: bool = False) -> torch.Tensor:
    """Elementwise: is ``got`` within tolerance of ``expected``?"""
    if not expected.is_floating_point():
        return got == expected  # integers and masks: exactly equal
    both_inf = torch.isinf(got) & torch.isinf(expected) & (torch.sign(got) == torch.sign(expected))
    # Only finite expectations get a tolerance: rtol * inf would let any
    # number pass for -inf (a mask filled with -1e9 instead of -inf).
    close = torch.isfinite(expected) & ((got - expected).abs() <= atol + rtol * expected.abs())
    close = close | both_inf
    if equal_nan:
        close = close | (torch.isnan(got) & torch.isnan(expected))
    return close


def matches(got: object, expected: object) -> bool:
    """Whether ``got`` equals ``expected`` within tolerance, NaN equal to NaN."""
    if hasattr(expected, "matched_by"):  # a known bug's output as the student edition keeps it
        return expected.matched_by(got)
    if isinstance(expected, (tuple, list)):
        return (isinstance(got, (tuple, list)) and len(got) == len(expected)
                and all(matches(g, e) for g, e in zip(got, expected)))
    if not isinstance(expected, (torch.Tensor, np.ndarray)) or type(got) is not type(expected):
        return False
    if tuple(got.shape) != tuple(expected.shape) or got.dtype != expected.dtype:
        return False
    got_t, expected_t = _as_tensor(got).cpu(), _as_tensor(expected).cpu()
    return bool(close_mask(got_t, expected_t, *_tolerance(expected_t.dtype), equal_nan=True).all())


def expect_close(
    got: object,
    expected: torch.Tensor | np.ndarray,
    what: str,
    *,
    lookalikes: Callable[[], Iterable[tuple[str, object]]] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    reference: str = "the reference",
    axes: Sequence[str] = (),
) -> None:
    """``got`` equals ``expected`` within the dtype's tolerance.

    Args:
        got: what the submission returned.
        expected: the right answer.
        what: the value being checked, for the message ("weights of
            scaled_dot_product_attention(q (2, 5, 8), ...)").
        lookalikes: called only on a mismatch; yields ``(hint, wrong value)``
            pairs, the known bugs run on the same inputs
            (``known_bugs.Lookalikes``). The first hint whose value matches
            ``got`` goes with the failure.
        rtol, atol: override the dtype's tolerance.
        reference: what ``expected`` came from, for the message.
        axes: names of the last axes of ``expected`` ("queries", "keys"),
            for a relation's hint where no known bug's applies.
    """
    tolerance = _tolerance(_as_tensor(expected).dtype, rtol, atol)
    try:
        expect_like(got, expected, what)
    except CheckFailure as failure:  # a wrong shape can be a known bug's shape
        failure.hint = failure.hint or matching_hint(got, lookalikes)
        # Where no known bug's hint (a plain str) was found, a relation may still name the mistake.
        if type(failure.hint) is not str and isinstance(got, torch.Tensor) == isinstance(expected, torch.Tensor) and \
                isinstance(got, (torch.Tensor, np.ndarray)):  # of the right kind: another shape or dtype
            failure.compared = Compared(got, expected, tuple(axes), *tolerance, lookalikes is not None)
        raise
    got_t, expected_t = _as_tensor(got), _as_tensor(expected)
    close = close_mask(got_t, expected_t, *tolerance)
    if bool(close.all()):
        return
    message, summary = _difference(got_t.cpu(), expected_t.cpu(), close.cpu(), what, reference)
    hint = matching_hint(got, lookalikes)
    raise CheckFailure(message, hint=hint, summary=summary,
                       compared=None if type(hint) is str else Compared(got, expected, tuple(axes), *tolerance,
                                                                        lookalikes is not None))


def _difference(got: torch.Tensor, expected: torch.Tensor, close: torch.Tensor,
                what: str, reference: str) -> tuple[str, str]:
    """One sentence on how ``got`` differs, NaN/inf first, then the worst
    entry; and the same in a few words for a table cell."""
    shape = tuple(got.shape)
    wrong = int((~close).sum())
    total = got.numel()
    count = f"{wrong} of {total} entries differ"
    for bad, name in ((torch.isnan(got), "NaN"), (torch.isinf(got), "inf")):
        unexpected = bad & ~torch.isnan(expected) & ~torch.isinf(expected)
        if bool(unexpected.any()):
            first = int(torch.nonzero(unexpected.flatten())[0])
            at, value = _index_text(first, shape), f"{float(expected.flatten()[first]):.4g}"
            return (f"{what} has {name}{at} where {reference} has {value} ({count})",
                    f"{name}{at}, expected {value}; {count}")
    missed = ~close & torch.isinf(expected)  # e.g. -1e9 where a mask needs -inf
    if bool(missed.any()):
        first = int(torch.nonzero(missed.flatten())[0])
        at, value = _index_text(first, shape), f"{float(expected.flatten()[first]):.4g}"
        got_value = f"{float(got.flatten()[first]):.4g}"
        return (f"{what} has {got_value}{at} where {reference} has {value} ({count})",
                f"{got_value}{at}, expected {value}; {count}")
    if expected.dtype == torch.bool:
        first = int(torch.nonzero(~close.flatten())[0])
        at, value = _index_text(first, shape), bool(expected.flatten()[first])
        return (f"{what} is {not value}{at} where {reference} has {value} ({count})",
                f"{not value}{at}, expected {value}; {count}")
    error = (got.double() - expected.double()).abs()
    error = torch.where(close, torch.zeros_like(error), torch.nan_to_num(error, nan=float("inf")))
    worst = int(error.flatten().argmax())
    largest, at = f"{float(error.flatten()[worst]):.3g}", _index_text(worst, shape)
    return (f"{what}: max abs error {largest} against {reference}{at} (expected "
            f"{float(expected.flatten()[worst]):.4g}, got {float(got.flatten()[worst]):.4g}; {count})",
            f"{count}, by up to {largest}{at}")


def matching_hint(got: object, lookalikes) -> str | None:
    """The hint of the first known bug (``lookalikes()`` yields ``(hint,
    value)``) whose value ``got`` matches; None if none does or
    ``lookalikes`` is None. The relations' lookalikes, after the known bugs
    (a ``RelationHint``: variants of the call, then edits of the
    reference), are not taken first come: all that give ``got`` are kept
    in one ``RelationHints``, since the checks of an exercise must agree on
    which to name."""
    if lookalikes is None:
        return None
    related: list[RelationHint] = []
    for hint, wrong in lookalikes():
        if matches(got, wrong):
            if not isinstance(hint, RelationHint):
                return hint
            if hint not in related:
                related.append(hint)
    return RelationHints(related) if related else None


def expect_true(condition: bool, message: str) -> None:
    if not condition:
        fail(message)
