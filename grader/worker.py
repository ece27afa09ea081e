"""The worker: the only process that runs student code.

The fork server (``grader.forkserver``) forks a worker from a copy of the
grader that has already imported torch. The worker first confines itself
(``grader.isolation``: what it may read, write, signal and start), then runs
the submission's top-level statements one by one, then answers requests
("call this function with these arguments") until the grader closes the
pipe. Each answer is plain data (``grader.wire``); the verdict is the
grader's, in another process.

A worker serves one exercise: before the file's first statement it refuses,
at torch's dispatcher, what that exercise asks the student to write
(``grader.refusals``). A call runs, when asked, under the device tracker
(``grader.portability``) or the footprint measure (``grader.footprint``):
what they find shapes a message, never a point, since the student's code
in this process can change them.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import functools
import io
import linecache
import os
import signal
import sys
import traceback
import types
import warnings

import torch

from grader import isolation, refusals, wire
from grader.footprint import Measure
from grader.isolation import Limits, Policy
from grader.loading import Submission
from grader.module_calls import ModuleCall, run_module_call
from grader.notebook_check import WORKER_VARIABLE
from grader.portability import DeviceTracker

STACK_SIGNAL = signal.SIGUSR1  # the grader's question "where are you?" (``report_stack_on_signal``)


def main(inherited: int, policy: Policy, submission: Submission, read_fd: int, write_fd: int,
         request: dict) -> None:
    """The body of a worker, in the child the fork server forked: confine,
    run the file's statements, answer calls. ``request`` is ``Worker``'s;
    ``inherited`` the address space of the process it was forked from."""
    limits = Limits(**request["limits"])
    skip, report = frozenset(request["skip"]), request["report"]

    def send(message: dict) -> None:
        data = wire.dump(message)
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view):]

    def receive() -> dict | None:
        header = _read_exactly(read_fd, wire.HEADER.size)
        if header is None:
            return None
        payload = _read_exactly(read_fd, sum(wire.HEADER.unpack(header)))
        return None if payload is None else wire.load(header, payload)

    printed = _quiet()
    report_stack_on_signal(write_fd)
    try:
        refusals.install(request["forbidden"])  # first: a memory budget counts from after it
    except Exception:
        os._exit(isolation.CONFINEMENT_FAILED)  # rather no worker than one that refuses nothing
    isolation.confine(policy, limits, inherited, request.get("budget", 0))
    if policy.readable:  # the staged submissions: a chapter may import an earlier chapter's file
        sys.path.insert(0, policy.readable[0])
    module = _run_statements(submission, skip, send, report, printed)
    _serve(module, receive, send, printed)


def _quiet() -> Printed:
    """Signals, output and threads of a worker: Ctrl-C is the grader's, a
    crash is reported by the grader. What the student's code prints
    through ``sys.stdout`` and ``sys.stderr`` is kept, bounded, to send back
    (``Printed``); what reaches the file descriptors goes nowhere, and so
    do warnings: the checks' edge cases set off NumPy's and torch's in
    correct code, which a student did not print."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ[WORKER_VARIABLE] = "1"  # a check() left in graded code does nothing here
    faulthandler.disable()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    sys.stdout = sys.stderr = printed = Printed()
    warnings.showwarning = lambda *args, **kwargs: None
    torch.set_num_threads(1)  # small tensors; and workers run side by side
    _full_precision_float32()
    return printed


class Printed(io.TextIOBase):
    """``sys.stdout`` and ``sys.stderr`` of a worker: keeps the first
    ``wire.MAX_PRINTED`` characters written since the last ``take`` and
    counts the rest, so that a print flood costs the time of a count and
    no memory. The grader shows the text on request; it is never graded."""

    def __init__(self):
        super().__init__()
        self._kept: list[str] = []
        self._size = 0
        self._more = 0

    @property
    def encoding(self) -> str:
        return "utf-8"

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return 1  # /dev/null, for code that writes to the descriptor (faulthandler.enable())

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        kept = text[:wire.MAX_PRINTED - self._size]
        if kept:
            self._kept.append(kept)
            self._size += len(kept)
        self._more += len(text) - len(kept)
        return len(text)

    def take(self) -> dict:
        """What was printed since the last ``take``, as plain data."""
        taken = {"text": "".join(self._kept), "more": self._more}
        self._kept, self._size, self._more = [], 0, 0
        return taken


def report_stack_on_signal(fd: int) -> None:
    """On ``STACK_SIGNAL``, write every thread's Python stack to ``fd`` (the
    reply pipe): the grader sends it to a worker over its time, so that the
    message names the line it was on. faulthandler writes from the signal
    handler itself, in C, so a loop that never returns to the interpreter
    is seen too. Student code can turn it off; then the message has no line."""
    faulthandler.register(STACK_SIGNAL, file=fd, all_threads=True, chain=False)


def _full_precision_float32() -> None:
    """TF32 off, so float32 matmuls on a GPU are as exact as the reference's."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9; mixing with the old flags is an error
        matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
    else:
        matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def _run_statements(
    submission: Submission, skip: frozenset[int], send, report: bool, printed: Printed
) -> types.ModuleType:
    """Execute the submission's top-level statements one by one.

    A statement that raises is recorded and the rest still run, so a stray
    test call at the bottom of the file costs nothing. With ``report``, the
    line of each statement is sent before it runs: if the worker then hangs
    or dies, the grader knows which line did it; and what they printed is
    sent once they ran (a worker that does not report drops it: the one
    that probed the file sent it already).
    """
    module = types.ModuleType(submission.module_name)
    module.__file__ = str(submission.path)
    sys.modules[submission.module_name] = module
    # Lines quoted in messages come from the code that runs, not from the
    # file on disk: a notebook's code is assembled from its cells, and a file
    # may be saved again while it is graded. (No modification time: kept.)
    linecache.cache[module.__file__] = (len(submission.source), None,
                                        submission.source.splitlines(keepends=True), module.__file__)
    for name, problem in submission.broken.items():
        # Whoever calls a function that did not compile learns why.
        module.__dict__[name] = _unparsable(name, problem.where or f"line {problem.line}")
    errors = {}
    for line, code, _ in submission.statements:
        if line in skip:
            continue
        if report:
            send({"event": "statement", "line": line})
        try:
            exec(code, module.__dict__)
        except BaseException as error:  # SystemExit and KeyboardInterrupt included
            described = _describe_error(error, module.__file__)
            errors[str(line)] = f"{described['type']}: {described['message']}"
    if report:
        names = {
            name: ("class" if isinstance(value, type) else "function" if callable(value)
                   else wire._type_name(value))
            for name, value in vars(module).items()
            if not name.startswith("__")
        }
        send({"event": "loaded", "errors": errors, "names": names, "printed": printed.take()})
    printed.take()
    return module


def _unparsable(name: str, where: str):
    """``where``: the problem's place as the student finds it (a notebook's cell)."""

    def function(*args, **kwargs):
        raise SyntaxError(f"{name} has a syntax error at {where}, so it cannot run")

    function.__name__ = name
    return function


def _on(device: str, value: object) -> object:
    """Inputs travel as CPU bytes; the student's function gets them on ``device``
    (tensors inside a tuple or list too: a KV cache is a tuple)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_on(device, item) for item in value)
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _serve(module: types.ModuleType, receive, send, printed: Printed) -> None:
    """Answer requests until the grader closes the pipe.

    With ``"portability"`` the call's tensors are followed
    (``DeviceTracker``) and the answer says what would go wrong on a GPU;
    with ``"measure"`` it gives the largest tensor the call made and its
    widest reduction (``Measure``). Each answer carries what the call printed.
    """
    filename = module.__file__
    reached = Reached(module)
    while True:
        request = receive()
        if request is None:
            return
        reached.watch(request.get("watch", ()))
        name, device = request["function"], request["device"]
        args = [_on(device, value) for value in wire.decode(request["args"])]
        kwargs = {key: _on(device, wire.decode(value)) for key, value in request["kwargs"].items()}
        grad = request.get("grad")
        tracker = DeviceTracker(filename) if request.get("portability") else None
        measure = Measure(filename) if request.get("measure") else None
        try:
            recipe = request.get("module")
            recipe = ModuleCall.decode(recipe) if recipe is not None else None
            if grad:
                for index in grad["wrt"]:
                    args[index] = args[index].detach().requires_grad_(True)
            if tracker is not None:
                tracker.mark_inputs([*args, *kwargs.values()])
            with contextlib.ExitStack() as stack:
                for mode in (tracker, measure):
                    if mode is not None:
                        stack.enter_context(mode)
                if recipe is None:
                    result = getattr(module, name)(*args, **kwargs)
                else:
                    result = run_module_call(module, name, recipe, args, kwargs, device)
            answer = {"ok": True, "value": wire.encode(result)}
            if tracker is not None:
                answer["portability"] = tracker.problem(result)
            if measure is not None:
                answer["footprint"] = {"largest": measure.largest, "reduction": measure.widest}
            if grad:
                answer["grads"] = _gradients(result, args, grad)
        except BaseException as error:
            answer = {"ok": False, "error": _describe_error(error, filename)}
            reached.missing(error)
            if tracker is not None:
                answer["portability"] = tracker.problem(None)
        answer["reached"] = reached.take()
        answer["printed"] = printed.take()
        # Sent back so the grader can tell whether the function changed its inputs.
        answer["args"] = wire.encode(list(args))
        answer["kwargs"] = {key: wire.encode(value) for key, value in kwargs.items()}
        send(answer)


class Reached:
    """Which of the chapter's functions a call reached: the report says "it
    uses causal_mask, which fails too" only where causal_mask ran.

    A watched function is replaced in the module's namespace by a wrapper
    that notes the call, so the student's own calls (which look the name up
    there) pass through it; a watched class notes its ``__init__`` and
    ``forward``; a NameError for one the file failed to define counts too.
    Code that kept the original elsewhere is simply not seen.
    """

    def __init__(self, module: types.ModuleType):
        self.module = module
        self.names: set[str] = set()
        self._watched: set[str] = set()

    def watch(self, names) -> None:
        for name in set(names) - self._watched:
            self._watched.add(name)
            value = self.module.__dict__.get(name)
            if isinstance(value, type):
                for method in ("__init__", "forward"):
                    if callable(getattr(value, method, None)):
                        setattr(value, method, self._noting(name, getattr(value, method)))
            elif isinstance(value, types.FunctionType):
                self.module.__dict__[name] = self._noting(name, value)

    def _noting(self, name: str, function):
        @functools.wraps(function)
        def noted(*args, **kwargs):
            self.names.add(name)
            return function(*args, **kwargs)
        return noted

    def missing(self, error: BaseException) -> None:
        """A call of a watched name that the file failed to define reached it too."""
        if isinstance(error, NameError) and getattr(error, "name", None) in self._watched:
            self.names.add(error.name)

    def take(self) -> list[str]:
        """The names reached since the last ``take``."""
        names, self.names = sorted(self.names), set()
        return names


def _gradients(result: object, args: list, grad: dict) -> dict:
    """Gradients of ``<output, grad_output>`` with respect to chosen arguments."""
    output = result[grad["output"]] if grad.get("output") is not None else result
    if not isinstance(output, torch.Tensor) or not output.requires_grad:
        return {"ok": False, "message": "the output does not depend on the inputs through autograd"}
    inputs = [args[index] for index in grad["wrt"]]
    # <output, grad_output> as a scalar gives the same gradients as passing
    # grad_outputs, and skips a costly lazy import of torch's.
    scalar = (output * grad["grad_output"].to(output.device)).sum()
    grads = torch.autograd.grad(scalar, inputs, allow_unused=True)
    return {"ok": True, "values": [wire.encode(g) for g in grads]}


def _describe_error(error: BaseException, filename: str) -> dict:
    """Plain-data account of an exception raised by student code."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == filename]
    where = frames[-1] if frames else None
    try:
        message = str(error)
    except BaseException:  # an exception class of the student's whose __str__ fails
        message = "(the exception's message could not be printed)"
    kind = type(error).__name__
    if isinstance(error, SystemExit):
        message = f"called sys.exit({error.code!r})"
    elif (isinstance(error, MemoryError) or "can't allocate memory" in message
          or isinstance(error, OSError) and error.errno == errno.ENOMEM):  # mmap past the budget
        kind, message = "MemoryError", "ran out of memory"
    return {
        "type": kind,
        "message": message[: wire.MAX_TEXT],
        "line": where.lineno if where else 0,
        "code": (where.line or "")[: wire.MAX_TEXT] if where else "",
    }


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(fd, min(remaining, 2**20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
