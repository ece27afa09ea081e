"""Run student code in a worker process; get data back, or the reason why not.

A ``Worker`` is forked by the fork server (``grader.forkserver``), a copy of
the grader that has already imported torch, so starting one costs
milliseconds instead of a second torch import. The child
runs the submission's statements and then answers requests ("call this
function with these arguments") until it is stopped. Whatever the student's
code does there (loop forever, exit, crash, print a flood, patch torch), the
grader only ever sees frames of plain data or a dead process, and turns the
latter into a reason: timed out, exited, crashed, ran out of memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import faulthandler
import functools
import linecache
import os
import resource
import select
import signal
import sys
import time
import traceback
import types
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from grader import wire
from grader.catalog import KERNELS
from grader.forkserver import ForkServer, ForkServerError
from grader.loading import Submission
from grader.module_calls import ModuleCall, run_module_call
from grader.notebook_check import WORKER_VARIABLE


@dataclass(frozen=True)
class Limits:
    """What one worker may spend.

    Attributes:
        check_seconds: wall time for one check (and for loading the file).
        exercise_seconds: wall time for all the checks of one exercise.
        memory_bytes: address space a worker may add to what it inherits
            (0: no limit).
    """

    check_seconds: float = 10.0
    exercise_seconds: float = 40.0
    memory_bytes: int = 2 * 2**30


class WorkerDied(Exception):
    """The worker stopped answering: ``reason`` says how, in words."""

    def __init__(self, reason: str, kind: str = "crash"):
        super().__init__(reason)
        self.reason = reason
        self.kind = kind  # "timeout", "exit", "crash", "memory" or "protocol"


# -- the child ----------------------------------------------------------------


class _ForbiddenCalls(TorchFunctionMode):
    """Refuses the torch functions an exercise asks the student to write."""

    def __init__(self, banned: dict[object, str]):
        super().__init__()
        self.banned = banned
        self.used: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = self.banned.get(func)
        if name is not None:
            self.used = self.used or name  # recorded even if the student catches the error
            raise RuntimeError(f"{name} may not be used in this exercise")
        return func(*args, **(kwargs or {}))


class _ForbiddenKernels(TorchDispatchMode):
    """Refuses the ATen kernels behind the forbidden functions, below every
    Python-level way around ``_ForbiddenCalls`` (``torch.ops.aten._softmax``,
    ``torch._C.DisableTorchFunction``)."""

    def __init__(self, banned: dict[str, str]):
        super().__init__()
        self.banned = banned  # "aten::_softmax" -> "torch.softmax"
        self.used: str | None = None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Else torch wraps the hook for torch.compile, whose first call imports
        # torch._dynamo: a second in every worker, for code nobody compiles.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in self.banned:
            kernel = name.replace("::", ".")
            self.used = self.used or f"{kernel} (the kernel of {self.banned[name]})"
            raise RuntimeError(f"{kernel} may not be used in this exercise")
        return func(*args, **(kwargs or {}))


# ATen ops that combine many entries of a tensor along dimensions (their ``dim`` argument,
# or all of them): how many a single call combines is how much of a row the code holds at
# once. Scans and sorts count too: they read the whole dimension.
_REDUCTIONS = frozenset({
    "aten::amax", "aten::amin", "aten::max", "aten::min", "aten::argmax", "aten::argmin",
    "aten::sum", "aten::nansum", "aten::mean", "aten::prod", "aten::logsumexp", "aten::var",
    "aten::std", "aten::linalg_vector_norm", "aten::norm", "aten::_softmax", "aten::_log_softmax",
    "aten::cumsum", "aten::cumprod", "aten::cummax", "aten::cummin", "aten::logcumsumexp",
    "aten::sort", "aten::topk", "aten::kthvalue", "aten::median",
})
# Matrix products sum over one dimension too: the index of the operand whose last
# dimension is summed (``addmm(bias, a, b)`` sums over a's).
_CONTRACTIONS = {"aten::mm": 0, "aten::bmm": 0, "aten::mv": 0, "aten::dot": 0, "aten::addmm": 1,
                 "aten::baddbmm": 1, "aten::addmv": 1, "aten::addbmm": 1}


def _reduced_width(func, args: tuple, kwargs: dict) -> int | None:
    """How many entries one output of this ATen call combines, or None for an op that
    combines none (elementwise ops, ``max(a, b)``, views...)."""
    name = func._schema.name
    if name in _CONTRACTIONS:
        operand = args[_CONTRACTIONS[name]] if len(args) > _CONTRACTIONS[name] else None
        return int(operand.shape[-1]) if isinstance(operand, torch.Tensor) and operand.dim() else None
    if name not in _REDUCTIONS or not args or not isinstance(args[0], torch.Tensor):
        return None
    if any(isinstance(arg, torch.Tensor) for arg in args[1:]):
        return None  # aten::max.other and the like: elementwise between two tensors
    shape = args[0].shape
    arguments = {argument.name: (index, argument) for index, argument in enumerate(func._schema.arguments)}
    dim = None
    if "dim" in kwargs:
        dim = kwargs["dim"]
    elif "dim" in arguments:
        index, argument = arguments["dim"]
        # Arguments left at their defaults may not be passed: sort's and topk's dim is -1.
        dim = args[index] if index < len(args) else argument.default_value
    if dim is None or dim == []:  # no dim: every entry
        return int(args[0].numel())
    width = 1
    for axis in ([dim] if isinstance(dim, int) else dim):
        width *= int(shape[axis]) if shape else 1
    return width


class _Footprint(TorchDispatchMode):
    """Records what a memory-efficient exercise must keep small: the largest
    tensor any ATen op of the call makes (never the ``(L, S)`` scores), and
    the widest reduction, how many entries one max, sum or matrix product
    combines (one block of a row, not the whole row).

    Ops whose results alias an input are left out of the sizes: views
    (``expand``, a transpose) and in-place or ``out=`` ops return memory that
    was counted when it was made. Tensors are sized by the bytes of their
    storage.
    """

    def __init__(self):
        super().__init__()
        self.largest: dict | None = None  # {"shape": [...], "numel": n, "bytes": b}
        self.widest: dict | None = None  # {"op": "amax", "width": n, "shape": [...]}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as _ForbiddenKernels: no torch._dynamo import in the worker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        try:
            width = _reduced_width(func, args, kwargs)
        except Exception:  # an odd call of the student's is not the grader's to fail
            width = None
        if width is not None and (self.widest is None or width > self.widest["width"]):
            self.widest = {"op": func._schema.name.removeprefix("aten::"), "width": width,
                           "shape": list(args[_CONTRACTIONS.get(func._schema.name, 0)].shape)}
        if any(returned.alias_info is not None for returned in func._schema.returns):
            return result
        for output in _flatten(result):
            if isinstance(output, torch.Tensor):
                with contextlib.suppress(RuntimeError, NotImplementedError):  # no storage (sparse)
                    size = output.untyped_storage().nbytes()
                    if self.largest is None or size > self.largest["bytes"]:
                        self.largest = {"shape": list(output.shape), "numel": output.numel(),
                                        "bytes": size}
        return result


class _DeviceTracker(TorchFunctionMode):
    """Finds the tensors that would sit on the wrong device on a GPU, on any machine.

    Every tensor is either on the inputs' device or made on a fixed one:
    made by a factory call without ``device=`` (``torch.ones(T, T)``), at
    import time (a module-level constant), or computed from such tensors
    only. On a GPU the latter stay on the CPU, and an operation that mixes
    them with the inputs fails. This mode follows every torch call of the
    student's function on the CPU and records the first such mix, or notes
    that the answer itself would come back on the CPU.

    Exemptions follow PyTorch: a tensor with no dimensions may meet any
    device, and indexing accepts CPU indices. Parameters and buffers are on
    the inputs' device, where the grader moves the student's module.
    """

    _FIXED = "_grader_fixed_device"  # attribute: where a tensor was made, or None
    _INDEXING = frozenset({"__getitem__", "__setitem__"})

    def __init__(self, filename: str):
        super().__init__()
        self.filename = filename
        self.mixed: dict | None = None  # the first mix: {"line", "code", "made": [...]}

    def mark_inputs(self, values) -> None:
        """The call's arguments are on the inputs' device by definition."""
        for value in _flatten(values):
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
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        tensors = [t for t in _flatten((args, kwargs)) if isinstance(t, torch.Tensor)]
        if name in self._INDEXING:
            tensors = tensors[:1]  # x[mask] takes a CPU mask on any device
        moved = (kwargs.get("device") is not None or name == "cuda"
                 or name == "to" and any(isinstance(a, (str, torch.device, torch.Tensor)) for a in args[1:]))
        if moved:
            made = None
        elif not tensors:
            made = self._student_lines()  # a factory call without device=
        else:
            fixed = [self.fixed(t) for t in tensors]
            following = any(f is None for f in fixed)
            # A CPU tensor with no dimensions may meet the GPU; one with dimensions may not.
            stuck = [f for t, f in zip(tensors, fixed) if f is not None and t.dim() > 0]
            if following and stuck and self.mixed is None:
                where = self._student_lines()
                self.mixed = {**(where[0] if where else {"line": 0, "code": ""}), "made": stuck[0]}
            made = None if following else (stuck or [f for f in fixed if f is not None])[0]
        for output in _flatten(result):
            if isinstance(output, torch.Tensor) and not isinstance(output, torch.nn.Parameter):
                with contextlib.suppress(AttributeError, RuntimeError):
                    setattr(output, self._FIXED, made)
        return result

    def _student_lines(self) -> list[dict]:
        """The lines of the student's file on the stack, innermost first (at most 3)."""
        lines = []
        frame = sys._getframe(1)
        while frame is not None and len(lines) < 3:
            if frame.f_code.co_filename == self.filename:
                code = linecache.getline(self.filename, frame.f_lineno).strip()
                lines.append({"line": frame.f_lineno, "code": code[: wire.MAX_TEXT]})
            frame = frame.f_back
        return lines

    def problem(self, result: object) -> dict | None:
        """What would go wrong on a GPU, or None: ``{"kind": "mixed" or
        "returned", "line", "code": where, "made": [lines where the CPU tensor was made]}``."""
        if self.mixed is not None:
            return {"kind": "mixed", **self.mixed}
        for output in _flatten(result):
            if isinstance(output, torch.Tensor) and output.dim() > 0:
                made = self.fixed(output)
                if made is not None:
                    return {"kind": "returned", "line": 0, "code": "", "made": made}
        return None


def _flatten(value: object):
    """The items of nested tuples, lists and dict values."""
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _flatten(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flatten(item)
    else:
        yield value


def _resolve(dotted: str) -> object | None:
    """``"torch.nn.functional.softmax"`` -> the function, or None if absent."""
    module_name, _, rest = dotted.partition(".")
    target: object = sys.modules.get(module_name)
    for part in rest.split("."):
        target = getattr(target, part, None)
    return target


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
    elif isinstance(error, MemoryError) or "can't allocate memory" in message:
        kind, message = "MemoryError", "ran out of memory"
    return {
        "type": kind,
        "message": message[: wire.MAX_TEXT],
        "line": where.lineno if where else 0,
        "code": (where.line or "")[: wire.MAX_TEXT] if where else "",
    }


_STUDENT_ACCOUNT: tuple[int, int] | None = None  # (uid, gid) workers run as; None: as the grader


def run_workers_as(uid: int, gid: int) -> None:
    """Run every worker started from now on as this account: the grader
    runs as root (Gradescope), student code must not. Call it before grading."""
    global _STUDENT_ACCOUNT
    _STUDENT_ACCOUNT = (uid, gid)


def _isolate(submission: Submission, limits: Limits, inherited: int) -> None:
    """Make this freshly forked process a worker: limits, silence, one thread.
    ``inherited``: the address space it was forked with, in bytes (0: unknown)."""
    if _STUDENT_ACCOUNT is not None:
        uid, gid = _STUDENT_ACCOUNT
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        except OSError:
            os._exit(70)  # rather no worker than student code running as root
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the grader's to handle
    os.environ[WORKER_VARIABLE] = "1"  # a check() left in graded code does nothing here
    with contextlib.suppress(OSError, AttributeError):  # Linux only
        # Die with the grader rather than linger as an orphan: PR_SET_PDEATHSIG.
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    faulthandler.disable()  # a crash is reported by the grader, not dumped on its terminal
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.memory_bytes and inherited:
        # The fork inherits torch's address space; allow that plus the budget.
        # (Not with CUDA: it reserves far more address space than it uses.)
        cap = inherited + limits.memory_bytes
        with contextlib.suppress(ValueError, OSError):  # not every system enforces it
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    torch.set_num_threads(1)  # small tensors; and workers may run side by side
    _full_precision_float32()
    # Printed output, from Python or C, goes nowhere: a print flood costs
    # the time of writing to /dev/null and no memory.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    sys.stdout = sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
    folder = str(submission.path.parent.resolve())
    sys.path.insert(0, folder)  # a chapter may import an earlier chapter's file
    with contextlib.suppress(OSError):
        os.chdir(folder)


def _address_space_bytes() -> int:
    """This process's virtual memory size; 0 where /proc does not tell (macOS)."""
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _run_statements(
    submission: Submission, skip: frozenset[int], send, report: bool
) -> types.ModuleType:
    """Execute the submission's top-level statements one by one.

    A statement that raises is recorded and the rest still run, so a stray
    test call at the bottom of the file costs nothing. With ``report``, the
    line of each statement is sent before it runs: if the worker then hangs
    or dies, the grader knows which line did it.
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
        module.__dict__[name] = _unparsable(name, problem.line)
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
        send({"event": "loaded", "errors": errors, "names": names})
    return module


def _on(device: str, value: object) -> object:
    """Inputs travel as CPU bytes; the student's function gets them on ``device``
    (tensors inside a tuple or list too: a KV cache is a tuple)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_on(device, item) for item in value)
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _full_precision_float32() -> None:
    """TF32 off, so float32 matmuls on a GPU are as exact as the reference's."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9; mixing with the old flags is an error
        matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
    else:
        matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def _unparsable(name: str, line: int):
    def function(*args, **kwargs):
        raise SyntaxError(f"{name} has a syntax error at line {line}, so it cannot run")

    function.__name__ = name
    return function


def _serve(module: types.ModuleType, receive, send) -> None:
    """Answer requests until the grader closes the pipe.

    A request with ``"portability"`` also follows the call's tensors
    (``_DeviceTracker``) and answers what would go wrong on a GPU; one with
    ``"measure"`` answers the largest tensor the call made and its widest
    reduction (``_Footprint``).
    """
    filename = module.__file__
    while True:
        request = receive()
        if request is None:
            return
        name, device = request["function"], request["device"]
        args = [_on(device, value) for value in wire.decode(request["args"])]
        kwargs = {key: _on(device, wire.decode(value)) for key, value in request["kwargs"].items()}
        banned, kernels = {}, {}
        for dotted in request.get("forbidden", ()):
            target = _resolve(dotted)
            if target is not None:
                banned[target] = dotted
            for kernel in KERNELS.get(dotted, ()):
                kernels.setdefault(kernel, dotted)
        grad = request.get("grad")
        # Each mode costs microseconds on every torch call: entered only when needed.
        mode = _ForbiddenCalls(banned) if banned else None
        below = _ForbiddenKernels(kernels) if kernels else None
        tracker = _DeviceTracker(filename) if request.get("portability") else None
        measure = _Footprint() if request.get("measure") else None
        try:
            recipe = request.get("module")
            recipe = ModuleCall.decode(recipe) if recipe is not None else None
            if grad:
                for index in grad["wrt"]:
                    args[index] = args[index].detach().requires_grad_(True)
            if tracker is not None:
                tracker.mark_inputs([*args, *kwargs.values()])
            with mode or contextlib.nullcontext(), below or contextlib.nullcontext(), \
                    tracker or contextlib.nullcontext(), measure or contextlib.nullcontext():
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
            if tracker is not None:
                answer["portability"] = tracker.problem(None)
        used = next((guard.used for guard in (mode, below) if guard is not None and guard.used), None)
        if used:
            answer = {"ok": False, "error": {"type": "Forbidden", "message": used, "line": 0, "code": ""}}
        # Sent back so the grader can tell whether the function changed its inputs.
        answer["args"] = wire.encode(list(args))
        answer["kwargs"] = {key: wire.encode(value) for key, value in kwargs.items()}
        send(answer)


def _gradients(result: object, args: list, grad: dict) -> dict:
    """Gradients of ``<output, grad_output>`` with respect to chosen arguments."""
    output = result[grad["output"]] if grad.get("output") is not None else result
    if not isinstance(output, torch.Tensor) or not output.requires_grad:
        return {"ok": False, "message": "the output does not depend on the inputs through autograd"}
    inputs = [args[index] for index in grad["wrt"]]
    # <output, grad_output> as a scalar gives the same gradients as passing
    # grad_outputs, and skips a lazy torch import that costs a second.
    scalar = (output * grad["grad_output"].to(output.device)).sum()
    grads = torch.autograd.grad(scalar, inputs, allow_unused=True)
    return {"ok": True, "values": [wire.encode(g) for g in grads]}


def _worker_main(inherited: int, submission: Submission, read_fd: int, write_fd: int,
                 request: dict) -> None:
    """The body of a worker, in the child the fork server forked: set up,
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

    _isolate(submission, limits, inherited)
    module = _run_statements(submission, skip, send, report)
    _serve(module, receive, send)


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(fd, min(remaining, 2**20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


# -- the grader's side --------------------------------------------------------


def fork_server(submissions: dict[str, Submission]) -> ForkServer:
    """Start the process that forks the workers of these submissions, by key."""
    # Measured here once rather than in every worker (a millisecond each):
    # the server, and the workers it forks, start with this address space.
    return ForkServer(submissions, functools.partial(_worker_main, _address_space_bytes()))


class Worker:
    """A forked process that has run a submission and answers calls into it.

    Args:
        server: the fork server that forks it (``fork_server``).
        key: which of the server's submissions it runs.
        limits: time, memory and output limits.
        skip: first lines of top-level statements not to run (ones that hung
            or killed an earlier worker).
        report: send the line of each statement before running it, and a
            summary of what the file defined once done (used to probe a file).
    """

    def __init__(self, server: ForkServer, key: str, limits: Limits,
                 skip: frozenset[int] = frozenset(), report: bool = False):
        self.limits = limits
        self._server = server
        request = {"limits": dataclasses.asdict(limits), "skip": sorted(skip), "report": report}
        try:
            self.pid, self._to_child, self._from_child = server.spawn(key, request)
        except ForkServerError as error:
            raise WorkerDied(f"could not be started ({error})", "crash") from None
        self._running = True

    # Frames from the child are read against a deadline; a missing answer
    # is a timeout, an end of file is a death whose cause waitpid tells.

    def receive(self, deadline: float) -> dict:
        header = self._read(wire.HEADER.size, deadline)
        size = sum(wire.HEADER.unpack(header))
        if size > wire.MAX_FRAME:
            self.kill()
            raise WorkerDied(f"sent an answer of {size / 2**20:.0f} MiB, over the limit", "protocol")
        try:
            return wire.load(header, self._read(size, deadline))
        except wire.WireError as error:
            self.kill()
            raise WorkerDied(str(error), "protocol") from None

    def request(self, message: dict, deadline: float) -> dict:
        """Send one request and wait for its answer until ``deadline``."""
        self._write(wire.dump(message), deadline)
        return self.receive(deadline)

    def _read(self, size: int, deadline: float) -> bytes:
        chunks, remaining = [], size
        poller = select.poll()
        poller.register(self._from_child, select.POLLIN)
        while remaining:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                self.kill()
                raise WorkerDied("timed out", "timeout")
            chunk = os.read(self._from_child, min(remaining, 2**20))
            if not chunk:
                raise self._death()
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def _write(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        poller = select.poll()
        poller.register(self._to_child, select.POLLOUT)
        os.set_blocking(self._to_child, False)
        while view:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                self.kill()
                raise WorkerDied("timed out", "timeout")
            try:
                view = view[os.write(self._to_child, view):]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise self._death() from None

    def _death(self) -> WorkerDied:
        """Why the child is gone, from its exit status."""
        self._close_pipes()
        try:
            status, was_running = self._server.status(self.pid)
        except ForkServerError as error:
            return WorkerDied(f"stopped answering ({error})")
        self._running = False
        if was_running:  # it closed its end of the pipe and went on
            return WorkerDied("closed its connection to the grader", "protocol")
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            if number == signal.SIGSEGV:
                return WorkerDied("crashed with a segmentation fault")
            if number == signal.SIGKILL:
                return WorkerDied("was killed, most likely for using too much memory", "memory")
            return WorkerDied(f"was killed by signal {signal.Signals(number).name}")
        code = os.WEXITSTATUS(status)
        return WorkerDied(f"ended the process (exit status {code}), e.g. with os._exit()", "exit")

    def kill(self) -> None:
        """Stop the worker now; safe to call more than once. The fork server
        reaps it, so this does not wait for the process to end."""
        if self._running:
            self._running = False
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)
        self._close_pipes()

    close = kill

    def _close_pipes(self) -> None:
        for fd in (self._to_child, self._from_child):
            if fd >= 0:
                os.close(fd)
        self._to_child = self._from_child = -1


@dataclass
class LoadResult:
    """What running a file's top-level statements found.

    Attributes:
        names: what the file defines: ``{name: "function", "class" or the
            type name of another value}``.
        errors: ``{first line of a statement: "NameError: ..."}`` for each
            statement that raised; the others ran.
        skipped: ``{first line: why}`` for statements that hung or killed
            the worker; workers do not run them.
        failure: set when the file could not be run at all.
        worker: the worker that ran the file, still running and answering
            calls, when it got through; the caller uses or kills it.
    """

    names: dict[str, str] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)
    failure: str | None = None
    worker: Worker | None = None


def probe(server: ForkServer, key: str, limits: Limits, max_faults: int = 3) -> LoadResult:
    """Run a file's top-level statements once and report what it defines;
    the worker that did it goes on to answer calls (``LoadResult.worker``).

    A statement that hangs or kills the worker is skipped and the file run
    again, up to ``max_faults`` times, so that one bad line at module level
    does not sink the whole file. What the worker reports is checked here:
    it comes from a process running student code.
    """
    skipped: dict[int, str] = {}
    while True:
        worker = Worker(server, key, limits, frozenset(skipped), report=True)
        deadline = time.monotonic() + limits.check_seconds
        line = None
        try:
            while True:
                message = worker.receive(deadline)
                if message.get("event") == "statement":
                    line = message.get("line")
                elif message.get("event") == "loaded":
                    errors = _text_dict(message.get("errors"))
                    return LoadResult(_text_dict(message.get("names")),
                                      {int(k): v for k, v in errors.items() if k.isdigit()}, skipped,
                                      worker=worker)
        except WorkerDied as death:
            worker.kill()
            reason = (f"did not finish within {limits.check_seconds:g} s"
                      if death.kind == "timeout" else death.reason)
            if type(line) is not int or line in skipped or len(skipped) >= max_faults:
                return LoadResult(skipped=skipped, failure=f"running the file {reason}")
            skipped[line] = reason
        except BaseException:
            worker.kill()
            raise


def _text_dict(value: object) -> dict[str, str]:
    """The str-valued entries of what should be a dict of str."""
    if not isinstance(value, dict):
        return {}
    return {key: text for key, text in value.items() if isinstance(text, str)}
