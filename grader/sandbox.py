"""The grader's handle on the workers that run student code.

A ``Worker`` is a process forked by the fork server (``grader.forkserver``),
a copy of the grader that has already imported torch, so starting one costs
a fork rather than a torch import. What runs in it is
``grader.worker``: it confines itself (``grader.isolation``), runs the
submission's statements and answers calls. Whatever the student's code does
there (loop forever, exit, crash, print a flood, patch torch), the grader
only ever sees frames of plain data or a dead process, and turns the latter
into a reason: timed out, exited, crashed, ran out of memory.

Every wait on a worker has a deadline in the worker's CPU time, the
kernel's count, read here from outside (``Worker.cpu_seconds``), and a
wall-clock backstop several times longer (``Limits``). A worker stopped for
time is first asked where it was: the signal ``worker.STACK_SIGNAL`` makes it
write its Python stack into its reply pipe, and the innermost line of the
student's file in it goes into the message. What it writes there is read for
a moment, bounded, and used for that message only.

``fork_server`` also prepares what the workers of one grade may touch: a
folder holding a copy of the submissions (the only files of the student's
they can read) and a scratch folder (the only place they can write), both
removed when the server closes. A command first forks the process its fork
servers come from (``clean_parent``), so that no worker inherits a secret.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import select
import shutil
import signal
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from grader import forkserver, isolation, wire, worker
from grader.catalog import CHAPTERS, COURSE_ROOT, META_RUN_PRELOAD, Chapter
from grader.forkserver import ForkServer, ForkServerError
from grader.isolation import CONFINEMENT_FAILED, Limits, Policy
from grader.loading import Submission
from grader.outcomes import Failure

__all__ = ["CPU_CLOCK", "Deadline", "Limits", "LoadResult", "Worker", "WorkerDied", "clean_parent", "fork_server",
           "preload", "probe", "timeout_reason"]

# Whether this system tells another process's CPU time: Linux's /proc does,
# macOS has no /proc and its limits stay wall time (``Worker.cpu_seconds``).
CPU_CLOCK = os.path.exists(f"/proc/{os.getpid()}/stat")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if "SC_CLK_TCK" in os.sysconf_names else 100
_POLL_SECONDS = 0.5  # how often a wait looks at the worker's CPU time, at most
_STACK_SECONDS = 1.0  # how long a worker stopped for time is given to tell where it was
_STACK_BYTES = 256 * 2**10  # and how much of what it writes is read
_MORE_SECONDS = 0.1  # how long the rest of a stack is waited for, once its innermost line is known


class WorkerDied(Exception):
    """The worker stopped answering: ``reason`` says how, in words.

    For a timeout, ``backstop`` says whether the clock's backstop stopped
    it rather than its CPU limit, ``line`` is the line of the student's
    file it was on, as its stack said, or None, and ``lines`` every line
    of the file on that stack, innermost first (the function it was in,
    and those that called it). A message's detail or a note, never more.
    """

    def __init__(self, reason: str, kind: Failure = Failure.CRASH, line: int | None = None,
                 backstop: bool = False, lines: tuple[int, ...] = ()):
        super().__init__(reason)
        self.reason = reason
        self.kind = Failure(kind)  # TIMEOUT, EXIT, CRASH, MEMORY or PROTOCOL
        self.line = line
        self.backstop = backstop
        self.lines = lines


@dataclass(frozen=True)
class Deadline:
    """When a wait on a worker gives up: once its CPU time reaches ``cpu``
    seconds (as ``Worker.cpu_seconds`` counts), or the clock (``time.monotonic``)
    reaches ``wall``, whichever comes first."""

    cpu: float
    wall: float


@functools.cache
def layers() -> frozenset[str]:
    """The isolation layers this machine has (``isolation.available``), asked once."""
    return isolation.available()


@functools.cache
def _python_folders() -> tuple[str, ...]:
    return isolation.python_folders(COURSE_ROOT)


def preload(chapters: Iterable[Chapter]) -> None:
    """Import the modules that the chapters' correct code imports on its own
    (``Chapter.preload``), here and now.

    For a process that forks many grades (a batch, ``verify``, ``watch``),
    before it forks the clean parent: each worker then inherits them
    instead of importing them again. A single grade does not call this, it
    would wait for the imports: there a copy of the fork server imports them
    beside the chapter's other checks (``grading._preloaded_copy``).
    """
    forkserver.import_all(name for chapter in chapters for name in chapter.preload)


def clean_parent(processes: int = 1) -> contextlib.AbstractContextManager[None]:
    """A block whose fork servers are forked from a process forked now
    (``forkserver.clean_parent``): a command enters it first, before it
    reads or imports a check, an oracle, a reference, a known bug or a
    recorded answer. This module has imported what a worker runs by then.

    ``processes``: how many grading processes will ask it for servers.
    Where several will, it imports what meta runs need (``META_RUN_PRELOAD``)
    once for all of them, instead of a copy of each one's server importing
    it again (``grading._preloaded_copy``); one process alone is quicker
    with its copy, which imports beside its checks rather than before them.
    """
    return forkserver.clean_parent(META_RUN_PRELOAD if processes > 1 else ())


def fork_server(submissions: dict[str, Submission], account: tuple[int, int] | None = None) -> ForkServer:
    """Start the process that forks the workers of these submissions, by key,
    with the folders they may read and write: forked from the clean parent
    where this process has one (``clean_parent``), else from this process.
    ``account``: the ``(uid, gid)`` its workers run as, where the grader
    runs as root (Gradescope) and student code must not; None: the grader's.

    Raises ForkServerError when the clean parent does not answer."""
    # Measured once rather than in every worker (a millisecond each): the
    # server, and the workers it forks, start with the address space of the
    # process it is forked from.
    origin = forkserver.servers_origin()
    inherited = origin.address_space if origin is not None else forkserver.address_space()
    folder = Path(tempfile.mkdtemp(prefix="mha-course-"))
    os.chmod(folder, 0o711)  # a worker of another account passes through, lists nothing
    stage, scratch = folder / "submissions", folder / "scratch"
    stage.mkdir(mode=0o755)
    scratch.mkdir(mode=0o711)
    _stage(submissions, stage)
    uid = account[0] if account else os.getuid()
    policy = Policy(str(scratch), _python_folders(), (str(stage),),
                    isolation.processes_of(uid) if uid != 0 else 0, account, layers())
    policy = dataclasses.replace(policy, rules=isolation.fixed_rules(policy))
    run = functools.partial(worker.main, inherited, policy)
    try:
        return ForkServer(submissions, run, folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


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
        filename: the student's file as its code objects name it
            (``Submission.path``): a timeout names the line it was on there.
    """

    def __init__(self, server: ForkServer, key: str, limits: Limits,
                 skip: frozenset[int] = frozenset(), report: bool = False, forbidden: tuple[str, ...] = (),
                 budget: int = 0, filename: str = ""):
        self.limits = limits
        self._server = server
        self._filename = filename
        self._started = time.monotonic()
        self._cpu = 0.0
        request = {"limits": dataclasses.asdict(limits), "skip": sorted(skip), "report": report,
                   "forbidden": list(forbidden), "budget": budget}
        try:
            self.pid, self._to_child, self._from_child = server.spawn(key, request)
        except ForkServerError as error:
            raise WorkerDied(f"could not be started ({error})", Failure.CRASH) from None
        self._running = True

    def cpu_seconds(self) -> float:
        """The worker's CPU time so far, user and system, of all its
        threads, as the kernel counts it (``/proc/<pid>/stat``; the worker
        is the fork server's child, so this process reads it from outside).
        Where the system tells no other process's CPU time (macOS), the
        wall time since the worker was asked for, so that limits are wall
        time there. Once the worker is gone, the last figure read."""
        if not CPU_CLOCK:
            return time.monotonic() - self._started
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{self.pid}/stat", "rb") as stat:
                # After the command name, which may hold spaces and parentheses.
                fields = stat.read().rpartition(b")")[2].split()
            self._cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime
        return self._cpu

    def deadline(self, cpu_seconds: float, wall_seconds: float) -> Deadline:
        """The deadline ``cpu_seconds`` of this worker's CPU time, or
        ``wall_seconds`` of the clock, from now."""
        return Deadline(self.cpu_seconds() + cpu_seconds, time.monotonic() + wall_seconds)

    # Frames from the child are read against a deadline; a missing answer
    # is a timeout, an end of file is a death whose cause waitpid tells.

    def receive(self, deadline: Deadline) -> dict:
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

    def request(self, message: dict, deadline: Deadline) -> dict:
        """Send one request and wait for its answer until ``deadline``."""
        self._write(wire.dump(message), deadline)
        return self.receive(deadline)

    def _read(self, size: int, deadline: Deadline) -> bytes:
        chunks, remaining = [], size
        poller = select.poll()
        poller.register(self._from_child, select.POLLIN)
        while remaining:
            self._wait(poller, deadline)
            chunk = os.read(self._from_child, min(remaining, 2**20))
            if not chunk:
                raise self._death()
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def _write(self, data: bytes, deadline: Deadline) -> None:
        view = memoryview(data)
        poller = select.poll()
        poller.register(self._to_child, select.POLLOUT)
        os.set_blocking(self._to_child, False)
        while view:
            self._wait(poller, deadline)
            try:
                view = view[os.write(self._to_child, view):]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise self._death() from None

    def _wait(self, poller: select.poll, deadline: Deadline) -> None:
        """Wait until the pipe is ready; past ``deadline``, stop the worker
        and raise a timeout. The CPU time is looked at every so often: a
        worker on one thread cannot use more of it than the clock runs."""
        if poller.poll(0):  # most often ready at once: no need to look at the CPU time
            return
        while True:
            cpu_left = deadline.cpu - self.cpu_seconds()
            wall_left = deadline.wall - time.monotonic()
            if cpu_left <= 0 or wall_left <= 0:
                raise self._timed_out(backstop=cpu_left > 0)
            if poller.poll(min(wall_left, max(cpu_left, 0.01), _POLL_SECONDS) * 1000):
                return

    def _timed_out(self, backstop: bool) -> WorkerDied:
        """Stop a worker over its time, once it has said where it was."""
        stack = self._current_stack()
        self.cpu_seconds()  # its last figure, for the message
        self.kill()
        return WorkerDied("timed out", Failure.TIMEOUT, stack.line, backstop, tuple(stack.lines))

    def _current_stack(self) -> StackReader:
        """Where the worker is in the student's file: send it
        ``worker.STACK_SIGNAL`` and read its stack from its reply pipe for a
        moment. Its ``line`` is None when it does not say (it turned the
        report off, or died of the signal, or is stuck outside the file)."""
        stack = StackReader(self._filename)
        if not self._filename or self._from_child < 0:
            return stack
        try:
            os.kill(self.pid, worker.STACK_SIGNAL)
        except OSError:
            return stack
        poller = select.poll()
        poller.register(self._from_child, select.POLLIN)
        ends = time.monotonic() + _STACK_SECONDS
        while not stack.complete and stack.size < _STACK_BYTES:
            # Once the line is known, its callers are read if they come at once.
            left = min(ends - time.monotonic(), _MORE_SECONDS if stack.done else _STACK_SECONDS)
            if left <= 0 or not poller.poll(left * 1000):
                break
            chunk = os.read(self._from_child, _STACK_BYTES - stack.size)
            if not chunk:
                break
            stack.feed(chunk)
        return stack

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
            if number == signal.SIGXCPU:  # the kernel's backstop, past the grader's own limits
                return WorkerDied("used up its CPU time", Failure.TIMEOUT)
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


_FRAME = re.compile(rb'  File "(.*)", line (\d{1,9}) in (\S*)')
_LONGEST_NAME = 500  # faulthandler writes this many characters of a file name, then "..."
_MOST_LINES = 64  # of the student's file on one stack, kept
# The worker's loops that call into the student's file: the stack within them is the call's.
_OUTERMOST = {b"_serve", b"_run_statements"}


class StackReader:
    """Finds, in what a worker wrote when asked where it was, the line of
    the student's file it was running.

    What a worker writes is faulthandler's dump: each thread's stack, a
    header and then a line per frame, innermost first, file names escaped
    to ASCII. The thread that runs the grader's requests is the one whose
    stack passes through ``grader.worker``; its innermost frame in the
    student's file is the line. Failing that (the dump cut short), the
    innermost such frame of any thread. The thread's other frames in the
    student's file, out to the worker's loop, give ``lines``: the function
    it was in, and those that called it.

    It is read as untrusted: student code may write anything to the pipe,
    or nothing. Lines are bounded, a malformed one is skipped, and what
    comes out is line numbers, for a message or a note and nothing else.
    """

    def __init__(self, filename: str):
        self._student = _as_dumped(filename)
        self._worker = _as_dumped(worker.__file__)
        self._partial = b""
        self._thread_lines: list[int] = []  # the student lines of the thread being read, innermost first
        self._any_line: int | None = None  # of the first thread that had one
        self.done = False  # the requests' thread has been found, and its innermost line
        self.complete = False  # and its stack read out to the worker's loop
        self.size = 0  # bytes fed so far

    @property
    def line(self) -> int | None:
        if self.done:
            return self._thread_lines[0] if self._thread_lines else None
        return self._any_line

    @property
    def lines(self) -> list[int]:
        """The requests' thread's lines of the student's file, innermost first."""
        return self._thread_lines if self.done else []

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        *lines, partial = (self._partial + data).split(b"\n")
        # A frame line is shorter (two names, each escaped at most 10 bytes a character).
        self._partial = partial if len(partial) <= 20 * _LONGEST_NAME + 100 else b""
        for text in lines:
            if self.complete:
                return
            self._read(text)

    def _read(self, text: bytes) -> None:
        frame = _FRAME.match(text)
        if frame is None:
            if not text.startswith(b"  "):  # the header of the next thread's stack
                self.complete = self.done
                if not self.done:
                    self._thread_lines = []
            return
        if frame[1] == self._student and len(self._thread_lines) < _MOST_LINES:
            self._thread_lines.append(int(frame[2]))
            self._any_line = self._any_line or self._thread_lines[0]
        elif frame[1] == self._worker:
            self.done = True
            self.complete = frame[3] in _OUTERMOST


def _as_dumped(filename: str) -> bytes:
    """A file name as faulthandler writes it: printable ASCII as it is,
    every other character escaped, cut at ``_LONGEST_NAME``."""
    def escaped(character: str) -> str:
        code = ord(character)
        if " " <= character <= "~":
            return character
        return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"

    text = "".join(map(escaped, filename[:_LONGEST_NAME])) + ("..." if len(filename) > _LONGEST_NAME else "")
    return text.encode("ascii")


def timeout_reason(death: WorkerDied, limit: str, wall_seconds: float, cpu_seconds: float,
                   submission: Submission | None = None) -> str:
    """What a worker stopped for time did, in words: ``used 2 s of CPU time
    without finishing, at line 14 (while True:)``.

    Args:
        death: the timeout.
        limit: the CPU limit it ran into, ``2 s``.
        wall_seconds: the clock's backstop it had.
        cpu_seconds: the CPU time it used against them.
        submission: the file, to say where it was (``death.line``).
    """
    where = _where_it_was(death.line, submission)
    if death.backstop:
        return f"did not finish within {wall_seconds:g} s, using {cpu_seconds:.1f} s of CPU time{where}"
    if not CPU_CLOCK:  # the limits are wall time here
        return f"did not finish within {limit}{where}"
    return f"used {limit} of CPU time without finishing{where}"


def _where_it_was(line: int | None, submission: Submission | None) -> str:
    """``, at line 14 (while True:)``, or "" for a line the file does not have."""
    lines = submission.source.splitlines() if submission is not None else []
    if line is None or not 1 <= line <= len(lines):
        return ""
    code = " ".join(lines[line - 1].split())
    code = code if len(code) <= 60 else code[:57] + "..."
    return f", at {submission.where(line)}" + (f" ({code})" if code else "")


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
        printed: what its statements printed, as the worker sent it
            (``{"text", "more"}``, unchecked: ``remote_submission.Printed`` reads it).
        worker: the worker that ran the file, still running and answering
            calls, when it got through; the caller uses or kills it.
    """

    names: dict[str, str] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)
    failure: str | None = None
    worker: Worker | None = None
    printed: object = None


def probe(server: ForkServer, key: str, limits: Limits, max_faults: int = 3,
          forbidden: tuple[str, ...] = (), submission: Submission | None = None) -> LoadResult:
    """Run a file's top-level statements once and report what it defines;
    the worker that did it goes on to answer calls (``LoadResult.worker``)
    for the exercise whose ``forbidden`` entry it refuses.

    A statement that hangs or kills the worker is skipped and the file run
    again, up to ``max_faults`` times, so that one bad line at module level
    does not sink the whole file. What the worker reports is checked here:
    it comes from a process running student code. ``submission``, the file
    under ``key``, lets a timeout say which line was running.
    """
    skipped: dict[int, str] = {}
    filename = str(submission.path) if submission is not None else ""
    while True:
        worker = Worker(server, key, limits, frozenset(skipped), report=True, forbidden=forbidden,
                        filename=filename)
        deadline = worker.deadline(limits.check_seconds, limits.check_wall_seconds)
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
                                      worker=worker, printed=message.get("printed"))
        except WorkerDied as death:
            worker.kill()
            reason = death.reason
            if death.kind == Failure.TIMEOUT:
                death.line = None if death.line == line else death.line  # the note names that line already
                reason = timeout_reason(death, f"{limits.check_seconds:g} s", limits.check_wall_seconds,
                                        worker.cpu_seconds(), submission)
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
