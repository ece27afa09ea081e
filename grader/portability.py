"""Would the student's code run on a GPU? Found on any machine.

The verdict is PyTorch's: a portability check runs the call with its
inputs on ``meta`` (or on the GPU being graded), where a tensor made on the
CPU that meets them raises, as on a GPU, and ``judge_portability_run`` reads
what came back.
``DeviceTracker`` runs in the worker beside it: a torch-function mode that
follows which tensors are made on a fixed device (``torch.ones(T, T)``
without ``device=``) and records the first place where such a tensor meets
the inputs, for the sentence the student reads; being the worker's own
account, it never decides a point.
"""

from __future__ import annotations

import contextlib
import gc
import linecache
import sys
import types

import torch
from torch.overrides import TorchFunctionMode

from grader import wire
from grader.compare import fail, note
from grader.outcomes import Failure
from grader.wire import devices, flatten

# -- in the worker ------------------------------------------------------------


class DeviceTracker(TorchFunctionMode):
    """Finds the tensors that would sit on the wrong device on a GPU, on any machine.

    Every tensor is either on the inputs' device or made on a fixed one:
    made by a factory call without ``device=`` (``torch.ones(T, T)``), at
    import time (a module-level constant), or computed from such tensors
    only. On a GPU the latter stay on the CPU, and an operation that mixes
    them with the inputs fails. This mode follows every torch call of the
    student's function on the CPU and records the first such mix, or notes
    that the answer itself would come back on the CPU.

    A tensor made on the CPU is harmless once moved: ``.to(x)``,
    ``.to(x.device)``, ``.type_as(x)``, ``x.new_tensor(...)``, ``copy_``
    into a tensor on the inputs' device and factories under
    ``with torch.device(x.device)`` all put their result where the inputs
    are. Exemptions follow PyTorch: a tensor with no dimensions may meet any
    device, and indexing accepts CPU indices. Parameters and buffers are on
    the inputs' device, where the grader moves the student's module.
    """

    _FIXED = "_grader_fixed_device"  # attribute: where a tensor was made, or None
    _INDEXING = frozenset({"__getitem__", "__setitem__"})
    # Calls whose result sits where one tensor argument is, whatever the others:
    # ``a.type_as(b)`` and ``a.to(b)`` on b's device; ``x.new_tensor(cpu)``,
    # ``x.new_ones(...)`` and ``x.copy_(cpu)`` on x's. Data may come from anywhere.
    _ON_DEVICE_OF = {"type_as": 1, "to": 1, "copy_": 0, "new_tensor": 0, "new_ones": 0,
                     "new_zeros": 0, "new_full": 0, "new_empty": 0, "new_empty_strided": 0}

    def __init__(self, filename: str):
        super().__init__()
        self.filename = filename
        self.mixed: dict | None = None  # the first mix: {"line", "code", "made": [...]}

    def mark_inputs(self, values) -> None:
        """The call's arguments are on the inputs' device by definition."""
        for value in flatten(values):
            if isinstance(value, torch.Tensor):
                setattr(value, self._FIXED, None)

    @classmethod
    def fixed(cls, tensor: torch.Tensor) -> list | None:
        """Where ``tensor`` was made on a fixed device (student lines,
        innermost first); None if it follows the inputs."""
        if isinstance(tensor, torch.nn.Parameter):
            return None
        made = getattr(tensor, cls._FIXED, False)
        return [] if made is False else made  # never seen: made at import

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Before the call: a mix that makes it raise (on meta, on a GPU) is recorded too.
        made = self._where_made(getattr(func, "__name__", ""), args, kwargs)
        result = func(*args, **kwargs)
        for output in flatten(result):
            if isinstance(output, torch.Tensor) and not isinstance(output, torch.nn.Parameter):
                with contextlib.suppress(AttributeError, RuntimeError):
                    setattr(output, self._FIXED, made)
        return result

    def _where_made(self, name: str, args: tuple, kwargs: dict) -> list | None:
        """Where a call's result sits: None on the inputs' device, else the
        student lines that made it on a fixed one. Records the first call
        that mixes the two."""
        if (kwargs.get("device") is not None or name == "cuda"
                or name == "to" and any(isinstance(a, (str, torch.device)) for a in args[1:])):
            return None  # device=x.device, .to(x.device), or the device a check asks for
        if name == "cpu":
            return self._student_lines()
        target = self._ON_DEVICE_OF.get(name)
        if target is not None and len(args) > target and isinstance(args[target], torch.Tensor):
            return self.fixed(args[target])
        tensors = [t for t in flatten((args, kwargs)) if isinstance(t, torch.Tensor)]
        if name in self._INDEXING:
            tensors = tensors[:1]  # x[mask] takes a CPU mask on any device
        if not tensors:
            return self._student_lines()  # a factory call without device=
        fixed = [self.fixed(t) for t in tensors]
        following = any(f is None for f in fixed)
        # A CPU tensor with no dimensions may meet the GPU; one with dimensions may not.
        stuck = [f for t, f in zip(tensors, fixed) if f is not None and t.dim() > 0]
        if following and stuck and self.mixed is None:
            where = self._student_lines()
            self.mixed = {**(where[0] if where else {"line": 0, "code": ""}), "made": stuck[0]}
        return None if following else (stuck or [f for f in fixed if f is not None])[0]

    def _student_lines(self) -> list[dict]:
        return student_lines(self.filename)

    def problem(self, result: object) -> dict | None:
        """What would go wrong on a GPU, or None: ``{"kind": "mixed" or
        "returned", "line", "code": where, "made": [lines where the CPU tensor was made]}``."""
        if self.mixed is not None:
            return {"kind": "mixed", **self.mixed}
        for output in flatten(result):
            if isinstance(output, torch.Tensor) and output.dim() > 0:
                made = self.fixed(output)
                if made is not None:
                    return {"kind": "returned", "line": 0, "code": "", "made": made}
        return None


def spare_meta_runs_the_dynamo_import() -> None:
    """Let meta runs start in milliseconds, not seconds. Called when this
    module is imported: before any process freezes its objects out of the
    garbage collector's sight (``gc.freeze``), and before it forks workers.

    Many of torch's meta kernels are Python functions wrapped by
    ``torch._compile._disable_dynamo``, whose first call imports
    ``torch._dynamo`` (a second or more) only to mark the function as one
    that dynamo should not trace. Outside ``torch.compile`` that mark
    changes nothing, so each wrapped function is given itself as its
    marked version, the cache the wrapper looks in first.
    """
    wrapper = torch._compile._disable_dynamo(lambda: None).__code__
    for found in gc.get_objects():
        if type(found) is types.FunctionType and found.__code__ is wrapper and found.__closure__:
            function = found.__closure__[wrapper.co_freevars.index("fn")].cell_contents
            with contextlib.suppress(AttributeError, TypeError):
                if getattr(function, "__dynamo_disable", None) is None:
                    function.__dynamo_disable = function


spare_meta_runs_the_dynamo_import()


def student_lines(filename: str, most: int = 3) -> list[dict]:
    """The lines of the student's file on the stack, innermost first:
    ``[{"line": 12, "code": "mask = torch.ones(T, T)"}]``, at most ``most``."""
    lines = []
    frame = sys._getframe(1)
    while frame is not None and len(lines) < most:
        if frame.f_code.co_filename == filename:
            code = linecache.getline(filename, frame.f_lineno).strip()
            lines.append({"line": frame.f_lineno, "code": code[: wire.MAX_TEXT]})
        frame = frame.f_back
    return lines


# -- in the grader ------------------------------------------------------------


def plain_line(line: int) -> str:
    return f"line {line}"


# How PyTorch words a call that mixes devices, on meta and on a GPU.
_MIXED = ("is not on the expected device", "Expected all tensors to be on the same device",
          "found at least two devices")


def device_for(graded: str) -> str:
    """Where a portability check runs a call: on a GPU being graded, there;
    on the CPU, ``meta``, which refuses what a GPU refuses (a tensor with
    dimensions made on the CPU meeting the inputs) and computes no values."""
    return "meta" if torch.device(graded).type == "cpu" else graded


def judge_portability_run(text: str, answer: dict, device: str, locate=plain_line) -> None:
    """The verdict on a call made with its inputs on ``device``
    (``device_for``), from what came back: a call that raised a device
    mismatch, or returned a tensor elsewhere, fails (``Failure.DEVICE``).
    The worker's device tracking (``answer["portability"]``) says where,
    in the message only. A call that could not run there for another
    reason (an operator without a meta kernel, ``.item()`` on a value that
    meta does not have) passes with a note: not knowing costs no point.
    An answer a worker made up fools only this check's message."""
    problem = answer.get("portability")
    if answer.get("ok"):
        kind = torch.device(device).type
        if any(torch.device(where).type != kind for where in devices(answer.get("value"))):
            fail(_sentence(text, problem if _kind(problem) == "returned" else {"kind": "returned"}, locate),
                 Failure.DEVICE)
        if _kind(problem) == "mixed":  # a mix meta lets through (a matrix product): only the worker saw it
            note(_sentence(text, problem, locate))
        return
    error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
    message = " ".join(str(error.get("message", "")).split())
    if any(words in message for words in _MIXED):
        fail(_sentence(text, problem, locate) if _kind(problem) == "mixed" else
             f"{text} would fail on a GPU: {message[:300]}; {_ADVICE}", Failure.DEVICE)
    said = f"{error.get('type', 'an error')}: {message[:200]}" if message else str(error.get("type", "an error"))
    found = f"; {_sentence(text, problem, locate)}" if _kind(problem) else ""
    # Moot where the exercise fails anyway: mostly the very error its failure says.
    note(f"{text} could not run with its inputs on the {device} device ({said}), so whether it would "
         f"run on a GPU is not known{found}", moot_if_failed=True)


_ADVICE = "make new tensors on the inputs' device (device=x.device), or on the device asked for"


def _kind(problem: object) -> str | None:
    return problem.get("kind") if isinstance(problem, dict) and problem.get("kind") in ("mixed", "returned") else None


def _sentence(text: str, problem: dict, locate=plain_line) -> str:
    """What would go wrong on a GPU, in words, with what the tracker's
    ``problem`` says of where (nothing, where it says nothing)."""
    made = problem.get("made") if isinstance(problem.get("made"), list) else None
    lines = [line for line in (_line_text(frame, locate) for frame in made or ()) if line]
    where = _line_text(problem, locate)
    if made is None:
        origin = ""
    elif lines and lines[0] == where:
        origin = "it makes on the CPU itself"
    elif lines:
        origin = f"made on the CPU at {lines[0]}" + "".join(f", called from {line}" for line in lines[1:])
    else:
        origin = "made on the CPU when your file was imported"
    if problem.get("kind") == "returned":
        return (f"{text} would return a tensor on the CPU when run on a GPU"
                + (f": it is {origin}" if origin else "") + f"; {_ADVICE}")
    return (f"{text} would fail on a GPU: {where or 'your code'} mixes the inputs with a tensor "
            f"{origin or 'made on the CPU'}; {_ADVICE}")


def _line_text(where: object, locate=plain_line) -> str:
    """``line 12 (mask = torch.ones(T, T))`` from a worker's ``{"line", "code"}``."""
    if not isinstance(where, dict) or type(where.get("line")) is not int or not where["line"]:
        return ""
    code = str(where.get("code", "")).strip()
    if "  #" in code:  # a comment says nothing the student does not have in front of them
        code = code[: code.index("  #")].rstrip()
    if code.endswith(("(", "[", "{", ",", "\\")):
        code += " ..."  # the statement goes on over more lines
    return locate(where["line"]) + (f" ({code})" if code else "")
