"""The hidden checks: one pytest file per chapter, run by ``grader.grading``.

Each check is a test function marked with the exercise it judges and whose
docstring is the sentence a student reads. Fixtures (from
``grader.plugin``): ``submission`` (the student's module, run in a worker),
``reference`` (the reference solution), ``bugs`` (known wrong versions, for
hints) and ``inputs`` (seeded random tensors). Everything here computes on
the CPU; the worker runs the student's code on the device being graded.

The helpers below are what checks of every chapter share: calling the
submission (and saying what was called), and judging attention's
``(output, weights)`` answers. ``grader.checks.oracles`` holds the
independent answers PyTorch gives.
"""

from __future__ import annotations

import pytest

from grader.compare import expect_close, fail, unpack
from grader.module_calls import ModuleCall, run_module_call

exercise = pytest.mark.exercise


def case_ids(cases) -> list[str]:
    """The ids of parametrize cases written as ``(id, ...)`` tuples."""
    return [case[0] for case in cases]


def run(submission, name: str, *args, **kwargs):
    """The submission's answer and a description of the call, for messages."""
    return submission.call(name, args, kwargs), submission.call_text(name, args, kwargs)


def run_module(submission, name: str, recipe: ModuleCall, *args, **kwargs):
    """Build the submission's class ``name`` as ``recipe`` says and call it;
    the answer and a description of the call."""
    return (submission.call(name, args, kwargs, module=recipe),
            submission.call_text(name, args, kwargs, module=recipe))


def reference_module_call(reference, name: str, recipe: ModuleCall, *args, **kwargs):
    """The reference's answer to the same module call (computed here)."""
    return run_module_call(reference, name, recipe, args, kwargs)


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


def expect_attention(got, expected, call_text: str, lookalikes=None, reference: str = "the reference"):
    """Check an ``(output, weights)`` answer, weights first: they explain the output."""
    output, weights = unpack(got, ("output", "weights"), call_text)
    expected_output, expected_weights = expected
    expect_close(weights, expected_weights, f"weights of {call_text}", reference=reference,
                 bugs=lookalikes.part(1) if lookalikes else None)
    expect_close(output, expected_output, f"output of {call_text}", reference=reference,
                 bugs=lookalikes.part(0) if lookalikes else None)
    return output, weights
