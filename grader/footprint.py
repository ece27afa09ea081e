"""How much a call holds at once: measured in the worker, judged in the grader.

Chapter 7's exercises must never make the ``(L, S)`` scores and must read a
row one block at a time. ``Measure`` is a dispatch mode that follows every
ATen op of the student's call in the worker and records the largest tensor
made and the widest reduction run (``reduced_width``: how many entries one
result of an op combines, for every ATen reduction); ``parse`` reads what
the worker sent back into a ``Footprint``, checked, in the grader. A worker
runs student code, so a measurement that does not come back, or comes back
malformed, fails the check: a call that makes no tensor and reduces nothing
cannot be attention. It can be a count, though: chapter 3's
``parameter_count`` must make no tensor at all (``PartlyMeasured``)."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grader.compare import CheckFailure
from grader.outcomes import Failure
from grader.portability import student_lines
from grader.reductions import reduced_width
from grader.wire import flatten

# -- in the worker -----------------------------------------------------------


class Measure(TorchDispatchMode):
    """Records what a memory-efficient exercise must keep small: the largest
    tensor any ATen op of the call makes (never the ``(L, S)`` scores), and
    the widest reduction, how many entries one result of a max, sum, matrix
    product, scan, sort, pooling... combines (one block of a row, not the
    whole row; ``reduced_width`` says how each op is read).

    A reduction of booleans (``any``, ``all``, a count of a mask) is kept
    apart, in ``widest_of_booleans``, and not sent to the grader: it can only
    count, not add numbers up, and correct code may well ask whether any key
    of a block is visible.

    Ops whose results alias an input are left out of the sizes: views
    (``expand``, a transpose) and in-place or ``out=`` ops return memory that
    was counted when it was made. Tensors are sized by the bytes of their
    storage.
    """

    def __init__(self, filename: str = ""):
        super().__init__()
        self.filename = filename  # the student's file: where the largest tensor was made
        self.largest: dict | None = None  # {"shape": [...], "numel": n, "bytes": b, "where": [...]}
        self.widest: dict | None = None  # {"op": "amax", "width": n, "shape": [...]}
        self.widest_of_booleans: dict | None = None  # the same, for reductions of booleans

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as ForbiddenKernels: no torch._dynamo import in the worker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        try:
            found = reduced_width(func, args, kwargs, result)
        except Exception:  # an odd call of the student's is not the grader's to fail
            found = None
        if found is not None:
            width, operand = found
            record = {"op": func._schema.name.removeprefix("aten::"), "width": int(width),
                      "shape": list(operand.shape)}
            if operand.dtype == torch.bool:
                self.widest_of_booleans = _wider(self.widest_of_booleans, record)
            else:
                self.widest = _wider(self.widest, record)
        if any(returned.alias_info is not None for returned in func._schema.returns):
            return result
        for output in flatten(result):
            if isinstance(output, torch.Tensor):
                with contextlib.suppress(RuntimeError, NotImplementedError):  # no storage (sparse)
                    size = output.untyped_storage().nbytes()
                    if self.largest is None or size > self.largest["bytes"]:
                        self.largest = {"shape": list(output.shape), "numel": output.numel(),
                                        "bytes": size, "where": student_lines(self.filename, 1)}
        return result


def _wider(record: dict | None, new: dict) -> dict:
    return new if record is None or new["width"] > record["width"] else record


# -- in the grader ------------------------------------------------------------


class Largest(NamedTuple):
    """The largest tensor a call made, as the worker measured it, and the
    line of the student's file that made it (0 and "": not known)."""

    shape: tuple[int, ...]
    numel: int
    line: int = 0
    code: str = ""


class Reduction(NamedTuple):
    """The widest reduction a call ran: ``op`` (an ATen name: ``amax``, ``sum``, ``bmm``...)
    combined ``width`` entries of a tensor of shape ``shape`` into each result."""

    op: str
    width: int
    shape: tuple[int, ...]


class Footprint(NamedTuple):
    """What a call held at once, as the worker measured it."""

    largest: Largest
    reduction: Reduction


class PartlyMeasured(CheckFailure):
    """The worker's measurement of a call that made no tensor, or ran no
    reduction: ``largest``, the largest tensor it made (None for none). A
    failure where the call must compute with tensors; where it must not (a
    count from a formula, chapter 3's ``parameter_count``), ``largest`` None
    is what a check wants."""

    def __init__(self, message: str, largest: Largest | None):
        super().__init__(message, Failure.PROTOCOL)
        self.largest = largest


def parse(text: str, found: object) -> Footprint:
    """The worker's measurement of the call ``text``, checked: it comes from
    a process running student code. Missing (the measuring mode was switched
    off) or malformed, it fails the check; without a tensor or a reduction,
    it fails with ``PartlyMeasured``."""
    def sizes(value) -> bool:
        return isinstance(value, list) and all(type(size) is int and size >= 0 for size in value)

    def count(value) -> bool:
        return type(value) is int and value >= 0

    largest, reduction = (found.get(key) if isinstance(found, dict) else None
                          for key in ("largest", "reduction"))
    well_formed = (
        (largest is None or isinstance(largest, dict) and sizes(largest.get("shape"))
         and count(largest.get("numel")))
        and (reduction is None or isinstance(reduction, dict) and sizes(reduction.get("shape"))
             and count(reduction.get("width")) and isinstance(reduction.get("op"), str))
    )
    if not well_formed:
        raise CheckFailure(f"{text}: the worker sent back a malformed measurement", Failure.PROTOCOL)
    made = Largest(tuple(largest["shape"]), largest["numel"], *_where(largest)) if largest is not None else None
    if made is None or reduction is None:
        message = (f"{text}: the grader's measurement of the call came back empty, as if it made no tensor "
                   "and added nothing up; was the measuring switched off?")
        if isinstance(found, dict) and {"largest", "reduction"} <= found.keys():
            raise PartlyMeasured(message, made)
        raise CheckFailure(message, Failure.PROTOCOL)
    return Footprint(made, Reduction(reduction["op"][:40], reduction["width"], tuple(reduction["shape"])))


def _where(largest: dict) -> tuple[int, str]:
    """The line and code a measurement says made its largest tensor, if it
    says so well-formed; else nothing (it shapes a message only)."""
    where = largest.get("where")
    first = where[0] if isinstance(where, list) and where and isinstance(where[0], dict) else {}
    line, code = first.get("line"), first.get("code")
    return (line, code[:200]) if type(line) is int and line > 0 and isinstance(code, str) else (0, "")
