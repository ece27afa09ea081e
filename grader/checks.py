"""What the hidden checks share; each chapter's are a pytest file of its own
(``grader/chapters/chNN/test_chNN_slug.py``), run by ``grader.grading``.

Each check is a test function marked with the exercise it judges and whose
docstring is the sentence a student reads. Fixtures (from
``grader.check_runner``): ``submission`` (the student's module, run in a worker),
``reference`` (the reference solution), ``bugs`` (known wrong versions, for
hints) and ``inputs`` (seeded random tensors). Everything here computes on
the CPU; the worker runs the student's code on the device being graded.

The helpers below are what checks of every chapter share: calling the
submission (and saying what was called), and judging attention's
``(output, weights)`` answers. Independent answers come from ``Oracles``:
the code that computes them lives in each chapter's ``oracles.py``, outside the
checks, so that the student edition holds no code that answers an exercise.
"""

from __future__ import annotations

import types

import pytest
import torch

from grader import recorded
from grader.catalog import find_chapter
from grader.compare import CheckFailure, Compared, describe, expect_close, fail, matching_hint, shape_text, unpack
from grader.isolation import BUDGET_COUNTED
from grader.module_calls import ModuleCall, run_module_call
from grader.outcomes import Failure
from grader.portability import device_for

exercise = pytest.mark.exercise
portability = pytest.mark.portability


class Oracles:
    """A chapter's independent answers: ``oracles.attention(q, k, v)`` is
    ``grader/chapters/chNN/oracles.py``'s ``attention(q, k, v)``, computed in the
    instructor's tree, computed and recorded while ``release`` records, and
    recorded in the student edition: as the grade's mode answers (``recorded.Mode``),
    which ``check_runner.ChapterRun`` hands over before it runs the chapter's checks
    (``answer_in``). Arguments are data (tensors, numbers, strings, tuples),
    since a recorded answer is found by them."""

    def __init__(self, chapter_id: str):
        self._chapter = find_chapter(chapter_id)
        self._mode: recorded.Mode | None = None

    def answer_in(self, mode: recorded.Mode) -> None:
        """Answer as ``mode`` does, for the checks of the run about to start."""
        self._mode = mode

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._answer(name, args, kwargs)

    def _answer(self, name: str, args: tuple, kwargs: dict):
        if self._mode is None:
            raise RuntimeError(f"oracles.{name} was asked outside a grade: no mode says how to answer")
        return self._mode.oracle(self._chapter, name, args, kwargs)


def case_ids(cases) -> list[str]:
    """The ids of parametrize cases written as ``(id, ...)`` tuples."""
    return [case[0] for case in cases]


def broadcast_shape(*shapes) -> torch.Size:
    """``torch.broadcast_shapes(*shapes)``, which imports torch._refs and
    sympy on its first call, a costly import a grade does without. Raises
    RuntimeError for shapes that do not broadcast."""
    scalar = torch.zeros(())
    return torch.broadcast_tensors(*(scalar.expand(shape) for shape in shapes))[0].shape


# Where attention's weights (or what is computed from them) hold NaN, the
# likely cause, said after the place.
NO_KEY = ("is every key of that query masked? Softmax over only -inf is NaN: a query with no key "
          "to attend to gets zero weights (and True in a mask means it may attend)")


def keys_text(row: torch.Tensor) -> str:
    """The keys one row ``(S,)`` of a boolean mask lets its query see: ``keys [0, 2]``."""
    keys = torch.nonzero(row).flatten().tolist()
    return "no key" if not keys else "keys [" + ", ".join(map(str, keys)) + "]"


def expect_mask(got, expected: torch.Tensor, call: str, lookalikes=None,
                reference: str = "the reference") -> None:
    """A boolean (L, S) mask equal to ``expected``; on a mismatch, say which
    keys the first wrong row lets its query see."""
    try:
        expect_close(got, expected, call, lookalikes=lookalikes, reference=reference)
    except CheckFailure as failure:
        if failure.kind != Failure.MISMATCH or not isinstance(got, torch.Tensor) or got.dim() != 2:
            raise
        if tuple(got.shape) != tuple(expected.shape) or got.dtype != torch.bool:
            raise
        got = got.cpu()
        wrong_rows = torch.nonzero((got != expected).any(dim=-1)).flatten().tolist()
        row = wrong_rows[0]
        fail(f"{call}: row {row} lets query {row} see {keys_text(got[row])}, expected "
             f"{keys_text(expected[row])} ({len(wrong_rows)} of {len(expected)} rows differ "
             f"from {reference})", hint=failure.hint)


def expect_int(got, expected: int, call: str, lookalikes, reference: str) -> None:
    """An int equal to ``expected`` (a count of bytes, say); a known bug's hint
    when it gives the same wrong value. Without one, the answer goes with the
    failure, so that a relation may name it."""
    if type(got) is not int or got != expected:
        message = (f"{call} returned {describe(got)}, expected an int ({expected})" if type(got) is not int else
                   f"{call} returned {got}, expected {expected} ({reference})")
        hint = next((hint for hint, wrong in lookalikes() if type(wrong) is type(got) and wrong == got), None)
        raise CheckFailure(message, hint=hint, compared=None if hint else Compared(got, expected))


def expect_finite(got, what: str, why: str = "", hint: str | None = None, nan_only: bool = False) -> None:
    """No NaN or inf in ``got``, or a failure that names it and where.

    A property test (``(w >= 0).all()``, sums to 1, a gradient's size) and a
    comparison with the submission's own earlier answer read NaN as false
    everywhere, and would name what it is not: negative entries, a zero
    gradient, an error of inf. So they ask this first. ``why``, the likely
    cause of NaN (``NO_KEY``), follows the place; ``hint`` is the known bug
    the answer matches, where the test it comes before would give one.
    ``nan_only`` where that test passes inf (a comparison: inf equals inf),
    so that this one fails nothing it passed. Anything but a tensor is left
    to the test that follows, which says what it is.
    """
    if not isinstance(got, torch.Tensor):
        return
    kinds = {"NaN": torch.isnan} if nan_only else {"NaN": torch.isnan, "inf": torch.isinf}
    for name, test in kinds.items():
        bad = test(got)
        if bool(bad.any()):
            at = f" at {bad.nonzero()[0].tolist()}" if got.dim() else ""
            count = f"{int(bad.sum())} of {got.numel()} entries"
            because = f"; {why}" if why and name == "NaN" else ""
            fail(f"{what}: {name}{at} ({count}){because}", hint=hint, summary=f"{name}{at} ({count})")


def run(submission, name: str, *args, **kwargs):
    """The submission's answer and a description of the call, for messages."""
    return submission.call(name, args, kwargs), submission.call_text(name, args, kwargs)


def expect_raises(submission, name: str, args: tuple, kwargs: dict, errors: tuple[str, ...],
                  why: str, module: ModuleCall | None = None, lookalikes=None) -> None:
    """The call (of a class built as ``module`` says, if given) raises one
    of ``errors`` (exception class names); ``why`` says what the docstring
    refuses, for the message. ``lookalikes``, as ``expect_close`` takes
    them, give a hint when what came back instead matches a known bug."""
    expected = " or ".join(f"an {error}" if error[0] in "AEIOU" else f"a {error}" for error in errors)
    try:
        got = submission.call(name, args, kwargs, module=module)
    except CheckFailure as failure:
        if failure.kind != Failure.ERROR:
            raise  # not implemented, out of time...: that verdict stands
        if not any(f" raised {error}" in failure.message for error in errors):
            fail(f"{failure.message}; expected {expected} ({why})", Failure.ERROR)
        return
    call = submission.call_text(name, args, kwargs, module=module)
    fail(f"{call} returned {describe(got)}; expected {expected} ({why})", hint=matching_hint(got, lookalikes),
         summary=f"returned {describe(got)}, expected {expected}")


def run_module(submission, name: str, recipe: ModuleCall, *args, **kwargs):
    """Build the submission's class ``name`` as ``recipe`` says and call it;
    the answer and a description of the call."""
    return (submission.call(name, args, kwargs, module=recipe),
            submission.call_text(name, args, kwargs, module=recipe))


def expect_portable(submission, name: str, *args, module: ModuleCall | None = None, **kwargs) -> None:
    """Call ``name`` with its inputs on a device that refuses what a GPU
    refuses (``meta``, or the GPU being graded): code that makes a tensor on
    a fixed device (``torch.ones(T, T)`` without ``device=``) and mixes it
    with the inputs fails there, or answers off it. A ``device`` argument
    is that device, as a check's ``device=submission.device`` is elsewhere."""
    if "device" in kwargs:
        kwargs["device"] = device_for(submission.device)
    submission.call(name, args, kwargs, module=module, portability=True)


def run_measured(submission, name: str, *args, **kwargs):
    """``(answer, footprint, call)``: the submission's answer, what the call
    held at once (``footprint.Footprint``: its largest tensor and its widest
    reduction) and the call's text."""
    value, footprint = submission.call(name, args, kwargs, measure=True)
    return value, footprint, submission.call_text(name, args, kwargs)


def run_within(submission, budget: int, name: str, *args, hint: str | None = None, **kwargs):
    """``(answer, call)`` of a call made in a worker of its own that may map
    ``budget`` bytes beyond what it maps before the file's first statement,
    as the kernel counts them: a call that needs more fails the check
    (``Failure.MEMORY``, with ``hint``). The verdict is the kernel's; a
    second run, measured by the worker itself, adds to the message which
    tensor was the largest and where it was made. Where the kernel keeps no
    such count (not Linux), the check is skipped, and says so."""
    if not BUDGET_COUNTED:
        pytest.skip("memory is counted by the kernel on Linux only: not measured on this system")
    call = submission.call_text(name, args, kwargs)
    try:
        return submission.call(name, args, kwargs, budget=budget), call
    except CheckFailure as failure:
        if failure.kind != Failure.MEMORY:
            raise
        fail(failure.message + _largest_tensor(submission, name, args, kwargs, failure.message), Failure.MEMORY,
             hint=hint)


def _largest_tensor(submission, name: str, args: tuple, kwargs: dict, said: str) -> str:
    """``"; its largest tensor was (1, 2048, 2048), made at line 12 (...)"``,
    as the worker measures it without a budget; "" if it does not say.
    ``said``: the message so far, which may name the line already."""
    try:
        largest = submission.call(name, args, kwargs, measure=True)[1].largest
    except CheckFailure as failure:
        largest = getattr(failure, "largest", None)  # a partial measurement (footprint.PartlyMeasured)
    if largest is None:
        return ""
    where = submission.submission.where(largest.line) if largest.line else ""
    if where and f"at {where} " in said + " ":
        where = ", made on that line"
    elif where:
        where = f", made at {where}" + (f" ({largest.code})" if largest.code else "")
    return f"; its largest tensor was {shape_text(largest.shape)}{where}"


def portable(name: str, make_args):
    """One case of a chapter's GPU-portability check: the exercise ``name``
    called with ``make_args(inputs) -> (args, kwargs)``; a ``module`` entry in
    kwargs (a ``ModuleCall``) makes it a class's call."""
    return pytest.param(name, make_args, marks=exercise(name), id=name)


def portability_check(cases: list):
    """A chapter's check that its exercises would run on a GPU, one case each
    (``portable(...)``): assign it to a ``test_`` name in the chapter's file.
    Its cases run after the chapter's other checks (``portability`` marker),
    in one worker, while what meta runs import is imported beside them."""

    @portability
    @pytest.mark.parametrize("name, make_args", cases)
    def check(submission, inputs, name, make_args):
        """would run on a GPU too: runs with its inputs on meta, where a tensor made on the CPU cannot meet them"""
        args, kwargs = make_args(inputs)
        expect_portable(submission, name, *args, **kwargs)

    return check


def reference_module_call(reference, name: str, recipe: ModuleCall, *args, **kwargs):
    """The reference's answer to the same module call (computed here)."""
    if not isinstance(reference, types.ModuleType):  # recorded (grader.recorded): the edition
        return reference.module_call(name, recipe, args, kwargs)
    return run_module_call(reference, name, recipe, args, kwargs)


def expect_module_matches_reference(submission, reference, bugs, name: str, recipe: ModuleCall, *args) -> None:
    """Build and call the submission's class ``name`` as ``recipe`` says,
    and expect the reference's answer to the same call; a wrong answer is
    compared with the known bugs of ``name``."""
    got, call = run_module(submission, name, recipe, *args)
    expect_close(got, reference_module_call(reference, name, recipe, *args), call,
                 lookalikes=bugs.module(name, recipe, *args))


def run_with_gradients(submission, name: str, args: list, kwargs: dict, wrt: list[int],
                        output: int | None, grad_output):
    """Run ``name`` in the worker and backpropagate ``grad_output`` from its
    output (item ``output`` of a tuple answer); ``((value, grads), call)``."""
    grad = {"wrt": wrt, "output": output, "grad_output": grad_output}
    return submission.call(name, args, kwargs, grad=grad), submission.call_text(name, args, kwargs)


def expect_gradients(grads: list, expected, names, call_text: str, reference: str = "PyTorch") -> None:
    """Each gradient close to the expected one; a missing one is a failure."""
    for name, mine, theirs in zip(names, grads, expected):
        if mine is None:
            fail(f"{call_text}: the output does not depend on {name} through autograd")
        expect_close(mine, theirs, f"gradient of {call_text} with respect to {name}", reference=reference)


def expect_attention(got, expected, call_text: str, lookalikes=None, reference: str = "the reference",
                     rtol: float | None = None):
    """Check an ``(output, weights)`` answer, weights first: they explain the output."""
    output, weights = unpack(got, ("output", "weights"), call_text)
    expected_output, expected_weights = expected
    expect_close(weights, expected_weights, f"weights of {call_text}", reference=reference,
                 lookalikes=lookalikes.part(1, got) if lookalikes else None, rtol=rtol, axes=("queries", "keys"))
    expect_close(output, expected_output, f"output of {call_text}", reference=reference,
                 lookalikes=lookalikes.part(0, got) if lookalikes else None, rtol=rtol, axes=("queries", "features"))
    return output, weights
