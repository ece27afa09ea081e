"""The grader's handle on the workers that run student code.

A ``Worker`` is a process forked by the fork server (``grader.forkserver``),
a copy of the grader that has already imported torch, so starting one costs
a fork rather than a torch import. What runs in it is
``grader.worker``: it confines itself (``grader.isolation``), runs the
submission's statements and answers calls. Whatever the student's code does
there (loop forever, exit, crash, print a flood, patch torch), the grader
only ever sees frames of plain data or a dead process, and turns the latter
into a reason: timed out, exited, crashed, ran out of memory. Every read
from a worker has a deadline.

``fork_server`` also prepares what the workers of one grade may touch: a
folder holding a copy of the submissions (the only files of the student's
they can read) and a scratch folder (the only place they can write), both
removed when the server closes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import select
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from grader import isolation, portability, wire, worker
from grader.catalog import CHAPTERS, COURSE_ROOT
from grader.forkserver import ForkServer, ForkServerError
from grader.isolation import CONFINEMENT_FAILED, Limits, Policy
from grader.loading import Submission
from grader.outcomes import Failure

__all__ = ["Limits", "LoadResult", "Worker", "WorkerDied", "fork_server", "probe", "run_workers_as"]


class WorkerDied(Exception):
    """The worker stopped answering: ``reason`` says how, in words."""

    def __init__(self, reason: str, kind: Failure = Failure.CRASH):
        super().__init__(reason)
        self.reason = reason
        self.kind = Failure(kind)  # TIMEOUT, EXIT, CRASH, MEMORY or PROTOCOL


_WORKER_ACCOUNT: tuple[int, int] | None = None  # (uid, gid) workers run as; None: as the grader


def run_workers_as(uid: int, gid: int) -> None:
    """Run every worker started from now on as this account: the grader
    runs as root (Gradescope), student code must not. Call it before grading."""
    global _WORKER_ACCOUNT
    _WORKER_ACCOUNT = (uid, gid)


@functools.cache
def layers() -> frozenset[str]:
    """The isolation layers this machine has (``isolation.available``), asked once."""
    return isolation.available()


@functools.cache
def _python_folders() -> tuple[str, ...]:
    return isolation.python_folders(COURSE_ROOT)


@functools.cache
def _prepared() -> None:
    """What this process does once before it forks workers (here or in a
    process forked from it): their meta runs need no torch._dynamo."""
    portability.spare_meta_runs_the_dynamo_import()


def fork_server(submissions: dict[str, Submission]) -> ForkServer:
    """Start the process that forks the workers of these submissions, by key,
    with the folders they may read and write."""
    _prepared()
    folder = Path(tempfile.mkdtemp(prefix="mha-course-"))
    os.chmod(folder, 0o711)  # a worker of another account passes through, lists nothing
    stage, scratch = folder / "submissions", folder / "scratch"
    stage.mkdir(mode=0o755)
    scratch.mkdir(mode=0o711)
    _stage(submissions, stage)
    uid = _WORKER_ACCOUNT[0] if _WORKER_ACCOUNT else os.getuid()
    policy = Policy(str(scratch), _python_folders(), (str(stage),),
                    isolation.processes_of(uid) if uid != 0 else 0, _WORKER_ACCOUNT, layers())
    policy = dataclasses.replace(policy, rules=isolation.fixed_rules(policy))
    # Measured here once rather than in every worker (a millisecond each):
    # the server, and the workers it forks, start with this address space.
    run = functools.partial(worker.main, _address_space_bytes(), policy)
    return ForkServer(submissions, run, folder)


def _stage(submissions: dict[str, Submission], stage: Path) -> None:
    """Copy into ``stage`` what workers may read of the student's: each
    submission's code as its module (a notebook's graded cells too), and the
    course's other chapter files beside it, so that a chapter may import an
    earlier one's. Nothing else of the folder it came from (a class's
    folder holds other students' work)."""
    modules = {chapter.module for chapter in CHAPTERS}
    for submission in submissions.values():
        (stage / f"{submission.module_name}.py").write_text(submission.source, encoding="utf-8")
    for submission in submissions.values():
        for module in modules - {s.module_name for s in submissions.values()}:
            sibling = submission.path.parent / f"{module}.py"
            target = stage / sibling.name
            if not target.exists() and sibling.is_file() and not sibling.is_symlink():
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    target.write_text(sibling.read_text(encoding="utf-8"), encoding="utf-8")
    for path in stage.iterdir():
        path.chmod(0o644)


def _address_space_bytes() -> int:
    """This process's virtual memory size; 0 where /proc does not tell (macOS)."""
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0



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
        forbidden: what the worker refuses from its first statement on
            (``grader.refusals``): the catalog entry of the one exercise it serves.
        budget: bytes the worker may map beyond what it maps before the
            file's first statement, for its whole life (0: no budget but
            the limits'): a memory check (``isolation.confine``).
    """

    def __init__(self, server: ForkServer, key: str, limits: Limits,
                 skip: frozenset[int] = frozenset(), report: bool = False, forbidden: tuple[str, ...] = (),
                 budget: int = 0):
        self.limits = limits
        self._server = server
        request = {"limits": dataclasses.asdict(limits), "skip": sorted(skip), "report": report,
                   "forbidden": list(forbidden), "budget": budget}
        try:
            self.pid, self._to_child, self._from_child = server.spawn(key, request)
        except ForkServerError as error:
            raise WorkerDied(f"could not be started ({error})", Failure.CRASH) from None
        self._running = True

    # Frames from the child are read against a deadline; a missing answer
    # is a timeout, an end of file is a death whose cause waitpid tells.

    def receive(self, deadline: float) -> dict:
        header = self._read(wire.HEADER.size, deadline)
        size = sum(wire.HEADER.unpack(header))
        if size > wire.MAX_FRAME:
            self.kill()
            raise WorkerDied(f"sent an answer of {size / 2**20:.0f} MiB, over the limit", Failure.PROTOCOL)
        try:
            return wire.load(header, self._read(size, deadline))
        except wire.WireError as error:
            self.kill()
            raise WorkerDied(str(error), Failure.PROTOCOL) from None

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
                raise WorkerDied("timed out", Failure.TIMEOUT)
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
                raise WorkerDied("timed out", Failure.TIMEOUT)
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
            return WorkerDied("closed its connection to the grader", Failure.PROTOCOL)
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            if number == signal.SIGSEGV:
                return WorkerDied("crashed with a segmentation fault")
            if number == signal.SIGKILL:
                return WorkerDied("was killed, most likely for using too much memory", Failure.MEMORY)
            return WorkerDied(f"was killed by signal {signal.Signals(number).name}")
        code = os.WEXITSTATUS(status)
        if code == CONFINEMENT_FAILED:
            return WorkerDied("could not confine itself (the grader's sandbox failed to start); "
                              "please report it", Failure.CRASH)
        return WorkerDied(f"ended the process (exit status {code}), e.g. with os._exit()", Failure.EXIT)

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


def probe(server: ForkServer, key: str, limits: Limits, max_faults: int = 3,
          forbidden: tuple[str, ...] = ()) -> LoadResult:
    """Run a file's top-level statements once and report what it defines;
    the worker that did it goes on to answer calls (``LoadResult.worker``)
    for the exercise whose ``forbidden`` entry it refuses.

    A statement that hangs or kills the worker is skipped and the file run
    again, up to ``max_faults`` times, so that one bad line at module level
    does not sink the whole file. What the worker reports is checked here:
    it comes from a process running student code.
    """
    skipped: dict[int, str] = {}
    while True:
        worker = Worker(server, key, limits, frozenset(skipped), report=True, forbidden=forbidden)
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
                      if death.kind == Failure.TIMEOUT else death.reason)
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
