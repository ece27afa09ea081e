"""The submission as the checks see it: a module whose functions run elsewhere.

``RemoteSubmission`` looks like the student's module (``submission.softmax(x)``)
but every call is sent to a worker process and only data comes back. It also
keeps the bookkeeping the checks should not have to: one worker per exercise,
the per-check and per-exercise time limits (the worker's CPU time, with the
clock as a backstop: ``sandbox.Limits``), and turning every way a call can
go wrong (missing function, syntax error, exception, timeout, crash, changed
inputs) into a ``CheckFailure`` with one clear sentence.
"""

from __future__ import annotations

import ast
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from grader import footprint
from grader.catalog import WHOLE_LIBRARY, Chapter
from grader.compare import CheckFailure, Raised, brief, raised_text
from grader.forkserver import ForkServer
from grader.loading import Submission, SubmissionError
from grader.module_calls import ModuleCall
from grader.outcomes import Failure
from grader.portability import device_for, judge_portability_run, plain_line
from grader.refusals import REFUSED
from grader.sandbox import Deadline, Limits, LoadResult, Worker, WorkerDied, fork_server, probe, timeout_reason
from grader.wire import MAX_PRINTED, WireError, decode, devices, encode

TOP_LEVEL = "top level"  # where the file's own statements print, beside exercises' names


class Signature(NamedTuple):
    """Where a top-level function of the file is defined, and its parameters."""

    line: int
    parameters: list[str]


_UNKNOWN = Signature(0, [])


@dataclass(frozen=True)
class _CallTime:
    """One call's share of its check's and its exercise's time."""

    deadline: Deadline
    limit: str  # the CPU limit it may run into, in words: "2 s"
    wall_limit: float  # the clock's backstop it has, in seconds
    started: float  # time.monotonic() when it was sent
    cpu: float  # the worker's CPU time then

    def reason(self, death: WorkerDied, worker: Worker, submission: Submission) -> str:
        """What a call that ``death`` stopped did, in words, and for a
        timeout a guess at why."""
        if death.kind != Failure.TIMEOUT:
            return death.reason
        used = worker.cpu_seconds() - self.cpu
        text = timeout_reason(death, self.limit, self.wall_limit, used, submission)
        if not death.backstop:
            return f"{text}: an infinite loop?"
        if used < (self.deadline.cpu - self.cpu) / 2:
            return f"{text}: is it asleep, or waiting for something?"
        return f"{text}: an infinite loop, on a machine too busy to give it much CPU time?"


@dataclass
class Printed:
    """What the student's code printed in one place (the file's top level,
    an exercise's calls): the first ``MAX_PRINTED`` characters, and how
    many more there were. Read from the worker's answers as data, shown on
    request, never graded."""

    text: str = ""
    more: int = 0

    def __bool__(self) -> bool:
        return bool(self.text or self.more)

    def add(self, sent: object) -> None:
        """Add what an answer says was printed (``{"text", "more"}``);
        anything else is ignored."""
        if not isinstance(sent, dict):
            return
        text, more = sent.get("text"), sent.get("more")
        if not isinstance(text, str) or type(more) is not int or more < 0:
            return
        kept = text[:max(MAX_PRINTED - len(self.text), 0)]
        self.text += kept
        self.more = min(self.more + more + len(text) - len(kept), 2**62)  # a count for a message, bounded


@dataclass
class _ExerciseState:
    cpu: float = 0.0  # seconds of worker CPU time used by this exercise's checks
    wall: float = 0.0  # seconds of the clock they took
    failure: CheckFailure | None = None  # sticky: a dead worker fails the rest


class RemoteSubmission:
    """The checks' handle on one chapter's submission.

    Args:
        chapter: the chapter the file is for.
        submission: the parsed file, or the error that stopped it being read.
        limits: time and memory limits for the workers.
        device: where the student's functions get their inputs. The grader
            itself computes on the CPU and never initialises CUDA, so that
            forked workers can.
        server: the fork server holding ``submission`` under the chapter's
            id; None starts one of its own when a worker is first needed.
        preloaded: a copy of ``server`` that has imported what some
            exercises preload (``Exercise.preload``) and what meta runs
            need (``catalog.META_RUN_PRELOAD``): their workers, and the
            portability calls', come from it. None: from ``server``, which
            has imported what it needs.
    """

    def __init__(self, chapter: Chapter, submission: Submission | SubmissionError,
                 limits: Limits, device: torch.device, server: ForkServer | None = None,
                 preloaded: ForkServer | None = None):
        self.chapter = chapter
        self.submission = submission
        self.limits = limits
        self.device = str(device)
        self._server = server
        self._preloaded = preloaded
        self._own_server: ForkServer | None = None
        self.notes: list[str] = []
        self.printed: dict[str, Printed] = {}  # by TOP_LEVEL or exercise, in the order they printed
        self._loaded_file = LoadResult()
        self._load_failure: str | None = None
        self._signatures: dict[str, Signature] = {}
        self._exercises: dict[str, _ExerciseState] = {}
        self._worker: Worker | None = None
        self._worker_exercise: str | None = None
        self._meta: Worker | None = None  # the portability calls' (``_meta_worker``)
        self._exercise: str | None = None
        # Told of each call before it runs (the function, args, kwargs, module recipe): while
        # ``release`` records, the edits of the reference that raise on those inputs
        # (``recorded.Recorder.submitted``).
        self.on_call: Callable[[str, tuple, dict, ModuleCall | None], None] | None = None
        self._check_cpu = 0.0  # CPU time the current check's calls used
        self._check_deadline = 0.0  # when the clock's backstop stops the current check
        self._loaded = False
        self.reached: set[str] = set()  # the chapter functions the current check's calls ran

    # -- loading ---------------------------------------------------------------

    def load(self, exercise: str) -> None:
        """Probe the file in a worker once: what it defines, what failed.
        The worker goes on to serve ``exercise``, the first one checked."""
        if self._loaded:
            return
        self._loaded = True
        if isinstance(self.submission, SubmissionError):
            self._load_failure = str(self.submission)
            return
        self._signatures = _signatures(self.submission)
        self._loaded_file = probe(self._fork_server(), self.chapter.id, self.limits,
                                  forbidden=self._forbidden(exercise), submission=self.submission)
        # A statement refused only because the probing worker serves
        # ``exercise`` (a comparison with torch.softmax at the bottom of the
        # file) ran in the other exercises' workers: not worth a note.
        self._loaded_file.errors = {line: error for line, error in self._loaded_file.errors.items()
                                    if REFUSED not in error}
        # The worker that loaded the file serves the first exercise checked:
        # a process fewer to fork, and its statements have already run.
        self._worker, self._worker_exercise = self._loaded_file.worker, None
        self._loaded_file.worker = None
        self._printed(TOP_LEVEL).add(self._loaded_file.printed)
        where = self.submission.where
        notes = [(problem.line, str(problem)) for problem in self.submission.problems]
        notes += [(line, f"{where(line)} {reason}; grading went on without it")
                  for line, reason in self._loaded_file.skipped.items()]
        notes += [(line, f"{where(line)}, at import: {error}; grading went on without it")
                  for line, error in self._loaded_file.errors.items()]
        self.notes = [text for _, text in sorted(notes)]
        self.notes = self.submission.notes + self.notes  # on the file as a whole: first
        if self._loaded_file.failure:
            self._load_failure = f"your file could not be run: {self._loaded_file.failure}"

    # -- the checks' side --------------------------------------------------------

    def begin_check(self, exercise: str) -> None:
        """Called before each check: which exercise, and a fresh time limit."""
        self.load(exercise)
        self._exercise = exercise
        self.reached = set()
        self._check_cpu = 0.0
        self._check_deadline = time.monotonic() + self.limits.check_wall_seconds
        if self._worker is not None and self._worker_exercise is None and not self._preloads(exercise):
            self._worker_exercise = exercise  # the fresh worker that loaded the file
        elif self._worker is not None and self._worker_exercise != exercise:
            self._stop_worker()

    def close(self) -> None:
        self._stop_worker()
        if self._meta is not None:
            self._meta.kill()
            self._meta = None
        if self._own_server is not None:
            self._own_server.close()
            self._own_server = None

    def _fork_server(self) -> ForkServer:
        if self._server is None and self._own_server is None:
            self._own_server = fork_server({self.chapter.id: self.submission})
        return self._server or self._own_server

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.call(name, args, kwargs)

    def call(self, function: str, args: tuple, kwargs: dict, grad: dict | None = None,
             module: ModuleCall | None = None, portability: bool = False, measure: bool = False,
             budget: int = 0):
        """Run ``function(*args, **kwargs)`` in the exercise's worker.

        With ``grad`` (``{"wrt": [arg indices], "output": index or None,
        "grad_output": tensor}``) the worker also backpropagates and this
        returns ``(value, [gradient per arg in wrt])``.

        With ``module``, ``function`` names an ``nn.Module`` class: the worker
        builds it as the recipe says and calls it with ``args`` and ``kwargs``.

        With ``portability``, the call runs with its inputs on
        ``portability.device_for(device)`` (``meta`` on the CPU) and is judged
        by what comes back (``portability.judge_portability_run``): a ``CheckFailure`` of kind
        ``Failure.DEVICE`` says where code would fail, or answer on the CPU,
        on a GPU; on any machine. It returns nothing.

        With ``measure``, this returns ``(value, footprint)``: the largest
        tensor the call made (by the bytes of its storage, views not counted)
        and the most entries one reduction of it combined (``footprint.Footprint``):
        the worker's own account, for messages.

        With ``budget`` (bytes), the call runs in a worker of its own that
        may map that much beyond what it maps before the file's first
        statement, as the kernel counts it (``isolation.BUDGET_COUNTED``): a
        call that needs more fails with ``Failure.MEMORY``.
        """
        exercise, state = self._begin_call(function, module)
        if self.on_call is not None and grad is None and not (portability or measure or budget):
            self.on_call(function, args, kwargs, module)
        text = self.call_text(function, args, kwargs, module)
        apart = bool(budget or portability)  # a worker apart from the exercise's: its death is this check's alone
        worker = self._worker_of_call(exercise, state, text, budget, portability)
        device = device_for(self.device) if portability else self.device
        request = {
            "function": function,
            "args": encode(list(args)),
            "kwargs": {key: encode(value) for key, value in kwargs.items()},
            "device": device,
            "portability": portability,
            "measure": measure,
            "grad": grad,
            "module": module.encode() if module is not None else None,
            "watch": self._uses(exercise),
        }
        try:
            answer = self._ask(worker, request, state, text, apart)
        finally:
            if budget:  # its worker served this call alone
                worker.kill()
        self._printed(exercise).add(answer.get("printed"))
        if isinstance(answer.get("reached"), list):
            self.reached.update(name for name in answer["reached"] if isinstance(name, str))
        if portability and not self._failed_as_anywhere(answer):
            return judge_portability_run(text, answer, device, self.submission.where)
        value = self._read_answer(answer, function, text, args, kwargs, grad, module, budget)
        if measure:
            return value, footprint.parse(text, answer.get("footprint"))
        return value

    def _begin_call(self, function: str, module: ModuleCall | None) -> tuple[str, _ExerciseState]:
        """The exercise a call counts against, and its state; a call that
        cannot run (the file did not load, the function is missing, the
        exercise's worker died or its time is used up) fails here."""
        self.load(self._exercise or function)
        self._refuse_unrunnable(function, module is not None)
        if module is not None and module.passed_to:
            self._refuse_unrunnable(module.passed_to)
        exercise = self._exercise or function
        state = self._exercises.setdefault(exercise, _ExerciseState())
        if state.failure is not None:
            raise state.failure
        self._refuse_over_time(exercise, state)
        return exercise, state

    def _worker_of_call(self, exercise: str, state: _ExerciseState, text: str, budget: int,
                        portability: bool) -> Worker:
        """The worker a call runs in: one of its own under a memory budget,
        the portability calls' one, or the exercise's. One that could not
        start fails the call; the exercise's fails the exercise's later calls too."""
        try:
            if budget:
                return self._budget_worker(exercise, budget)
            return self._meta_worker() if portability else self._worker_for(exercise)
        except WorkerDied as death:
            if budget or portability:
                raise _death_failure(text, death) from None
            state.failure = _death_failure(text, death)
            raise state.failure from None

    def _ask(self, worker: Worker, request: dict, state: _ExerciseState, text: str, apart: bool) -> dict:
        """Send ``request`` and wait, within what is left of the check's and
        the exercise's time, for the worker's answer; its time is counted
        whatever happens. A worker that dies fails the call; the exercise's
        own (not ``apart``) is gone, and fails the exercise's later calls too."""
        timing = self._time_for(worker, state)
        try:
            return worker.request(request, timing.deadline)
        except WorkerDied as death:
            # A loop's stack says which functions it was in: "it uses softmax,
            # which fails too" for a caller, as an answer's "reached" says.
            self.reached.update(self._defined_at(death.lines))
            failure = _death_failure(text, death, timing.reason(death, worker, self.submission))
            if apart:  # a worker apart: the exercise's goes on
                if worker is self._meta:
                    self._meta = None
                raise failure from None
            self._stop_worker()
            state.failure = failure
            raise failure from None
        finally:
            self._spend(timing, worker, state)

    def call_text(self, function: str, args: tuple, kwargs: dict,
                  module: ModuleCall | None = None) -> str:
        """``softmax(x (3, 5), dim=0)``: the call, with shapes but no input
        values; a module's call reads ``MultiHeadAttention(8, 2)(x (2, 5, 8))``."""
        names = self._parameters_of(function, module)
        parts = []
        for index, value in enumerate(args):
            label = names[index] + " " if index < len(names) else ""
            parts.append(label + _shapes(value) if _has_array(value) else _short_repr(value))
        for key, value in kwargs.items():
            if value is None:
                continue
            parts.append(f"{key} {_shapes(value)}" if _has_array(value) else f"{key}={_short_repr(value)}")
        if module is not None:
            return module.call_text(function, ", ".join(parts))
        return f"{function}({', '.join(parts)})"

    # -- internals ---------------------------------------------------------------

    def _refuse_over_time(self, exercise: str, state: _ExerciseState) -> None:
        """Fail a call of an exercise that has used up its time."""
        if state.cpu >= self.limits.exercise_seconds:
            raise CheckFailure(f"{exercise} used up its time limit of {self.limits.exercise_seconds:g} s",
                               Failure.TIMEOUT)
        if state.wall >= self.limits.exercise_wall_seconds:
            raise CheckFailure(f"{exercise} used up its time limit of {self.limits.exercise_wall_seconds:g} s "
                               "by the clock", Failure.TIMEOUT)

    def _time_for(self, worker: Worker, state: _ExerciseState) -> _CallTime:
        """What the next call may spend: what is left of the check's CPU
        time and of the exercise's, and of the clock's backstops."""
        started, cpu = time.monotonic(), worker.cpu_seconds()
        check_left = self.limits.check_seconds - self._check_cpu
        exercise_left = self.limits.exercise_seconds - state.cpu
        limit = (f"{self.limits.check_seconds:g} s" if check_left <= exercise_left
                 else f"the rest of the exercise's {self.limits.exercise_seconds:g} s")
        wall = min(self._check_deadline, started + self.limits.exercise_wall_seconds - state.wall)
        wall_limit = (self.limits.check_wall_seconds if wall == self._check_deadline
                      else self.limits.exercise_wall_seconds)
        return _CallTime(Deadline(cpu + min(check_left, exercise_left), wall), limit, wall_limit, started, cpu)

    def _spend(self, timing: _CallTime, worker: Worker, state: _ExerciseState) -> None:
        """Count what a call used against its check and its exercise."""
        used = worker.cpu_seconds() - timing.cpu
        self._check_cpu += used
        state.cpu += used
        state.wall += time.monotonic() - timing.started

    def _parameters_of(self, function: str, module: ModuleCall | None) -> list[str]:
        """The names of the arguments a call passes: of ``softmax``, of
        ``TinyLM.forward`` (or the recipe's method), or of the function the
        recipe hands its module to, less that first parameter."""
        if module is None:
            return self._signatures.get(function, _UNKNOWN).parameters
        if module.passed_to:
            return self._signatures.get(module.passed_to, _UNKNOWN).parameters[1:]
        return self._signatures.get(f"{function}.{module.method or 'forward'}", _UNKNOWN).parameters

    def _printed(self, where: str) -> Printed:
        return self.printed.setdefault(where, Printed())

    def _defined_at(self, lines: tuple[int, ...]) -> set[str]:
        """The top-level functions and classes of the file that hold these
        lines, as the grader parsed it."""
        return {node.name for _, _, node in self.submission.statements
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and any(node.lineno <= line <= (node.end_lineno or node.lineno) for line in lines)}

    def _uses(self, exercise: str) -> list[str]:
        """The earlier exercises ``exercise`` builds on, as the catalog says."""
        return next((list(e.uses) for e in self.chapter.exercises if e.name == exercise), [])

    def _refuse_unrunnable(self, function: str, is_class: bool = False) -> None:
        if self._load_failure:
            raise CheckFailure(self._load_failure, Failure.UNREADABLE)
        if function in self.submission.broken:
            raise CheckFailure(str(self.submission.broken[function]), Failure.ERROR)
        kind = self._loaded_file.names.get(function)
        if kind is None:
            line = self._signatures.get(function, _UNKNOWN).line
            if line in self._loaded_file.errors:
                raise CheckFailure(f"{function} is not defined: defining it at "
                                   f"{self.submission.where(line)} raised "
                                   f"{self._loaded_file.errors[line]}", Failure.MISSING)
            kind = "class" if is_class else "function"
            if self.submission.notebook is None:
                raise CheckFailure(f"your file defines no {kind} {function}", Failure.MISSING)
            raise CheckFailure(f"your notebook defines no {kind} {function}"
                               f"{self._notebook_hint(function)}", Failure.MISSING)
        if is_class and kind != "class":
            raise CheckFailure(f"{function} is a {kind}, not a class (an nn.Module)", Failure.MISSING)
        if not is_class and kind not in ("function", "class"):
            raise CheckFailure(f"{function} is a {kind}, not a function", Failure.MISSING)

    def _notebook_hint(self, function: str) -> str:
        """Why a notebook may lack a function: its exercise cell is gone or
        defines another name."""
        cells = self.submission.notebook.exercise_cells
        if function not in cells:
            return " (its exercise cell seems deleted: copy it back from a fresh notebook)"
        others = [name for name in cells[function] if name != function]
        if others:
            return f" (its exercise cell defines {', '.join(others)} instead: keep the name {function})"
        return ""

    def _forbidden(self, exercise: str) -> tuple[str, ...]:
        try:
            return self.chapter.exercise(exercise).forbidden
        except KeyError:
            return ()

    def _worker_for(self, exercise: str) -> Worker:
        """The exercise's worker, refusing what it forbids, kept for its checks."""
        if self._worker is None:
            self._worker = self._spawn(exercise, forbidden=self._forbidden(exercise))
            self._worker_exercise = exercise
        return self._worker

    def _budget_worker(self, exercise: str, budget: int) -> Worker:
        """A worker for one call under a memory budget, counted from before
        the file's first statement runs in it."""
        return self._spawn(exercise, forbidden=self._forbidden(exercise), budget=budget)

    def _meta_worker(self) -> Worker:
        """The worker of the chapter's portability calls, kept for all of
        them: forked where meta runs' imports were made (the preloaded copy,
        or the server, which has them), refusing nothing, since whether a
        call keeps to its inputs' device does not depend on what it calls."""
        if self._meta is None:
            self._meta = self._spawn(None)
        return self._meta

    def _spawn(self, exercise: str | None, **options) -> Worker:
        """A new worker for ``exercise`` (None: the portability calls); the
        time it takes to start is the grader's, not the check's (longer when
        a fork server had to be replaced)."""
        asked = time.monotonic()
        server = (self._preloaded if self._preloaded is not None and (exercise is None or self._preloads(exercise))
                  else self._fork_server())
        worker = Worker(server, self.chapter.id, self.limits, frozenset(self._loaded_file.skipped),
                        filename=str(self.submission.path), **options)
        self._check_deadline += time.monotonic() - asked
        return worker

    def _preloads(self, exercise: str) -> bool:
        """Whether ``exercise``'s workers come from the preloaded copy."""
        return self._preloaded is not None and any(
            e.name == exercise and e.preload for e in self.chapter.exercises)

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.kill()
        self._worker = None
        self._worker_exercise = None

    @staticmethod
    def _failed_as_anywhere(answer: dict) -> bool:
        """Did the call fail in a way no device explains: a refusal, or a
        ``NotImplementedError`` of the student's own (the stub's)?"""
        error = answer.get("error") if not answer.get("ok") and isinstance(answer.get("error"), dict) else None
        if error is None:
            return False
        message = str(error.get("message", ""))
        return message.endswith(REFUSED) or error.get("type") == "NotImplementedError" and "meta" not in message.lower()

    def _read_answer(self, answer: dict, function: str, text: str, args: tuple, kwargs: dict,
                     grad: dict | None, module: ModuleCall | None, budget: int = 0):
        try:
            if not answer.get("ok"):
                failure = _error_failure(text, answer.get("error"), self.submission.where, budget)
                error = answer.get("error")
                if failure.kind == Failure.ERROR and isinstance(error, dict) and grad is None:
                    failure.raised = Raised(function, args, kwargs, module,
                                            raised_text(str(error.get("type")), str(error.get("message", ""))))
                raise failure
            value = decode(answer.get("value"))
            _expect_device(text, answer.get("value"), self.device)
            after = decode(answer.get("args"))
            after_kwargs = answer.get("kwargs")
            if not isinstance(after_kwargs, dict):
                raise WireError("malformed answer")
            _expect_unchanged(text, list(args), after, self._parameters_of(function, module))
            for key, sent in kwargs.items():
                if key in after_kwargs:
                    _expect_unchanged(text, [sent], [decode(after_kwargs[key])], [key])
            if grad is None:
                return value
            grads = answer.get("grads")
            if not isinstance(grads, dict) or not grads.get("ok"):
                reason = grads.get("message") if isinstance(grads, dict) else None
                raise CheckFailure(f"{text}: {reason or 'no gradients came back'}")
            return value, [decode(g) for g in grads.get("values", [])]
        except WireError as error:
            raise CheckFailure(f"{text}: the worker sent back {error}", Failure.PROTOCOL) from None


def _signatures(submission: Submission) -> dict[str, Signature]:
    """The file's top-level functions, read from the statements' syntax
    trees, not by running them."""
    found = {}
    for line, _, node in submission.statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = Signature(line, _parameters(node))
        elif isinstance(node, ast.ClassDef):  # its methods, without self: "Class.forward"
            for method in node.body:
                if isinstance(method, ast.FunctionDef):
                    found[f"{node.name}.{method.name}"] = Signature(method.lineno, _parameters(method)[1:])
    return found


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [argument.arg for argument in node.args.posonlyargs + node.args.args]


def _is_array(value: object) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray))


def _has_array(value: object) -> bool:
    return _is_array(value) or isinstance(value, (tuple, list)) and any(map(_has_array, value))


def _shapes(value: object) -> str:
    """``(2, 5, 8)`` for a tensor, ``((1, 2, 3, 4), (1, 2, 3, 4))`` for a tuple of them:
    messages show the shapes of inputs, never their values."""
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_shapes(item) for item in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return brief(value) if _is_array(value) else _short_repr(value)


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _error_failure(text: str, error: object, locate=plain_line, budget: int = 0) -> CheckFailure:
    """The message for an exception raised inside the student's function;
    ``locate(line)`` says where a line is (``line 12``, or a notebook cell);
    ``budget``, the bytes the call could map (0: no budget but the limits')."""
    if not isinstance(error, dict):
        return CheckFailure(f"{text} failed", Failure.ERROR)
    kind = str(error.get("type", "Exception"))
    message = " ".join(str(error.get("message", "")).split())  # one line, whatever torch wrote
    line, code = error.get("line"), str(error.get("code", "")).strip()
    where = f" at {locate(line)}" + (f" ({code})" if code else "") if type(line) is int and line else ""
    if kind == "NotImplementedError":
        return CheckFailure("not implemented yet", Failure.NOT_IMPLEMENTED)
    if message.endswith(REFUSED):  # the worker's dispatcher refused it (grader.refusals)
        refused = message.removesuffix(REFUSED).strip()
        if refused in WHOLE_LIBRARY:
            return CheckFailure(f"{text} uses {refused}{where}: this exercise is written without {refused}",
                                Failure.FORBIDDEN)
        return CheckFailure(f"{text} calls {refused}{where}, which this exercise asks you to write yourself",
                            Failure.FORBIDDEN)
    if kind == "MemoryError" and budget:
        return CheckFailure(f"{text} needed more than {budget / 2**20:g} MiB at once{where}: "
                            "the kernel refused the memory", Failure.MEMORY)
    if kind == "MemoryError":
        return CheckFailure(f"{text} ran out of memory{where}", Failure.MEMORY)
    if kind == "SystemExit":
        return CheckFailure(f"{text} {message}{where}; return a value instead", Failure.EXIT)
    detail = f": {message}" if message else ""
    return CheckFailure(f"{text} raised {kind}{where}{detail}", Failure.ERROR)


def _death_failure(text: str, death: WorkerDied, reason: str = "") -> CheckFailure:
    """A dead worker's failure, in ``reason``'s words (by default ``death.reason``)."""
    return CheckFailure(f"{text} {reason or death.reason} (the exercise's other checks are skipped)",
                        death.kind)


def _expect_device(text: str, encoded: object, device: str) -> None:
    """Fail when a returned tensor is not on the device the inputs were on."""
    for where in sorted(devices(encoded)):
        if torch.device(where).type != torch.device(device).type:
            raise CheckFailure(f"{text} returned a tensor on {where} for inputs on {device}: "
                               "create new tensors on the inputs' device (device=x.device)")


def _same(before: object, after: object) -> bool:
    if isinstance(before, torch.Tensor):
        if not isinstance(after, torch.Tensor) or before.shape != after.shape:
            return False
        before, after = before.detach().cpu(), after.cpu()
        if before.is_floating_point():
            return bool(((before == after) | (before.isnan() & after.isnan())).all())
        return torch.equal(before, after)
    if isinstance(before, np.ndarray):
        return isinstance(after, np.ndarray) and np.array_equal(
            before, after, equal_nan=before.dtype.kind == "f")
    if isinstance(before, (tuple, list)):  # a KV cache travels as a tuple of tensors
        return (isinstance(after, (tuple, list)) and len(after) == len(before)
                and all(_same(b, a) for b, a in zip(before, after)))
    return True


def _expect_unchanged(text: str, sent: list, after: object, names: list[str]) -> None:
    """Fail when the function modified one of its array arguments in place."""
    if not isinstance(after, list) or len(after) != len(sent):
        raise WireError("malformed answer")
    for index, (before, now) in enumerate(zip(sent, after)):
        if not _same(before, now):
            name = names[index] if index < len(names) else f"argument {index + 1}"
            raise CheckFailure(f"{text} changed its input {name} in place; compute on a copy "
                               "(x = x - m rather than x -= m)")
