"""A small process that forks every worker, so the grader forks only once.

A fork is not free for the process that forks: afterwards every page it
writes to is copied, and a grader that forked a worker per exercise copied
its working set (pytest, the checks, the reference) once per fork, about
80,000 page faults for a whole course. A grading process forks one fork
server before it runs its first checks, which then sits idle but for its
forks: forking from it leaves the grader's memory alone, and the reaping of
killed workers happens there too.

The server inherits the parsed submissions, so a request names one by key.
It never runs student code itself: only its children do (``grader.worker``).
Forked before the grader's checks load the reference and the known bugs,
it keeps neither in its memory, nor do the workers it forks.

Protocol, over a Unix socket pair: each message is a 4-byte length and a
JSON object. A ``spawn`` answer carries the grader's ends of the worker's
two pipes as passed file descriptors (SCM_RIGHTS).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import shutil
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from grader import reaping
from grader.loading import Submission

_LENGTH = struct.Struct("!I")
_MAX_FDS = 2
GRACE_SECONDS = 1.0  # for a worker whose pipe closed, or the server, to end by itself
ANSWER_SECONDS = 10.0  # for the server to answer a request: it forks, or reaps, at once
# A preloaded copy imports before its first answer: torch._dynamo is two seconds of
# CPU time, over twenty by the clock with 4 busy processes a core. No student code
# has run below it yet, so a long wait can only be for the imports.
IMPORT_SECONDS = 120.0


class ForkServerError(RuntimeError):
    """The fork server stopped answering: killed, stopped, or a bug of the grader."""


class ForkServer:
    """Forks workers for the given submissions on request.

    Every request has a deadline (``ANSWER_SECONDS``, wall time: the server
    only forks, which takes a fraction of a second even on a loaded machine;
    a preloaded copy's first answer ``IMPORT_SECONDS`` more): a server that
    misses it is killed, and the next request starts a new one.

    Args:
        submissions: what workers may run, by key (a chapter id).
        run_worker: ``run_worker(submission, read_fd, write_fd, request)``,
            the body of a worker; it runs in the forked child and never returns.
        folder: the folder of the server's workers (``sandbox.fork_server``),
            removed when the server closes.
        parent, preload: for ``preloaded_copy``, which builds a server this way.
    """

    def __init__(self, submissions: dict[str, Submission],
                 run_worker: Callable[[Submission, int, int, dict], None], folder: Path | None = None,
                 *, parent: ForkServer | None = None, preload: Sequence[str] = ()):
        self._submissions = submissions
        self._run_worker = run_worker
        self._folder = folder
        self._parent = parent
        self._preload = tuple(preload)
        self.pid = 0
        self._socket: socket.socket | None = None
        self._start()

    def preloaded_copy(self, modules: Sequence[str]) -> ForkServer:
        """A second server, forked by this one, that imports ``modules``
        before it forks anything: workers that need them get them for free.

        It is forked from the server rather than from this process, so it
        holds what the server holds and nothing the grader loaded since
        (the reference, the known bugs). Asked for at once, it imports on
        another core while the grader goes on; a worker asked of it before
        the imports are done waits for them. It shares this server's
        folder, and ends when it is closed, or with this server.
        """
        return ForkServer({}, self._run_worker, parent=self, preload=modules)

    def _start(self) -> None:
        """Fork the server from this process, or a copy from the parent server."""
        if self._parent is not None:
            answer, fds = self._parent._ask({"op": "copy", "preload": list(self._preload)})
            if len(fds) != 1 or "pid" not in answer:
                for fd in fds:
                    os.close(fd)
                raise ForkServerError(answer.get("error", "the fork server sent no copy"))
            self.pid = answer["pid"]
            self._socket = socket.socket(fileno=fds[0])
            self._socket.settimeout(ANSWER_SECONDS + IMPORT_SECONDS)  # until its first answer
            return
        grader_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()  # else the copy's buffers hold this process's pending output too
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                grader_end.close()
                _serve(server_end, self._submissions, self._run_worker)
            finally:
                reaping.stop_descendants()
                os._exit(0)
        server_end.close()
        grader_end.settimeout(ANSWER_SECONDS)
        self.pid = pid
        self._socket = grader_end

    def spawn(self, key: str, request: dict) -> tuple[int, int, int]:
        """Fork a worker for submission ``key``; ``request`` is handed to it.

        Returns ``(pid, fd to write to the worker, fd to read from it)``;
        the caller owns both descriptors. A server that does not answer in
        time (stopped, wedged, killed) is killed and replaced, once.
        """
        try:
            answer, fds = self._ask({"op": "spawn", "key": key, "request": request})
        except ForkServerError:
            self._stop()
            self._start()
            answer, fds = self._ask({"op": "spawn", "key": key, "request": request})
        if len(fds) != 2 or "pid" not in answer:
            for fd in fds:
                os.close(fd)
            raise ForkServerError(answer.get("error", "the fork server sent no worker"))
        return answer["pid"], fds[0], fds[1]

    def status(self, pid: int) -> tuple[int, bool]:
        """The exit status of worker ``pid`` (``os.waitpid``'s) once it has
        ended, and whether it had to be killed for that: a worker that
        closed its pipe but still runs gets ``GRACE_SECONDS`` to end."""
        answer, _ = self._ask({"op": "status", "pid": pid})
        return answer["status"], answer["killed"]

    def close(self) -> None:
        """Stop the server, and with it every worker still running; remove
        the folder of its workers."""
        self._stop()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _stop(self) -> None:
        """End the server: it exits when its socket closes; one that does not
        within ``GRACE_SECONDS`` (stopped, wedged) is killed."""
        if self._socket is None:
            return
        self._socket.close()
        self._socket = None
        if self._parent is not None:
            # Not this process's child: the parent server reaps it. One that
            # does not end on its own is ended with the parent (``prctl``).
            return
        deadline = time.monotonic() + GRACE_SECONDS
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(self.pid, os.WNOHANG)[0] == 0:
                if time.monotonic() > deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)  # killed: returns at once
                    break
                time.sleep(0.001)

    def _ask(self, message: dict) -> tuple[dict, list[int]]:
        """One request and its answer. A server that fails to answer is
        stopped at once: a late answer would be read as the next one's."""
        if self._socket is None:
            raise ForkServerError("the fork server is closed")
        problem = "the fork server ended"
        try:
            _send(self._socket, message)
            answer = _receive(self._socket)
        except TimeoutError:
            answer, problem = None, f"the fork server did not answer within {self._socket.gettimeout():g} s"
        except OSError as error:
            answer, problem = None, f"the fork server failed: {error}"
        if answer is None:
            self._stop()
            raise ForkServerError(problem)
        self._socket.settimeout(ANSWER_SECONDS)  # a copy's imports are done
        return answer


def _send(sock: socket.socket, message: dict, fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    frame = _LENGTH.pack(len(data)) + data
    sent = socket.send_fds(sock, [frame], list(fds)) if fds else sock.send(frame)
    if sent < len(frame):
        sock.sendall(frame[sent:])


def _receive(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """One message and the descriptors that came with it; None at end of file."""
    # Passed descriptors arrive with the first bytes of their message.
    header, fds, _, _ = socket.recv_fds(sock, _LENGTH.size, _MAX_FDS)
    while header and len(header) < _LENGTH.size:
        more = sock.recv(_LENGTH.size - len(header))
        if not more:
            break
        header += more
    if len(header) < _LENGTH.size:
        for fd in fds:
            os.close(fd)
        return None
    (size,) = _LENGTH.unpack(header)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return json.loads(data), fds


# -- the server's side ----------------------------------------------------------


def _serve(sock: socket.socket, submissions: dict[str, Submission],
           run_worker: Callable[[Submission, int, int, dict], None]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the grader's to handle
    with contextlib.suppress(OSError, AttributeError):  # Linux only: die with the grader
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    # What a worker leaves behind (where the OS let it start processes) is
    # this server's to end, when it ends.
    reaping.adopt_orphans()
    _blank_inherited_fds(keep=sock.fileno())
    # Every object now alive stays as it is: a garbage collection in a
    # worker then walks only the worker's own objects, instead of touching
    # (and so copying) every page of torch's.
    gc.freeze()
    statuses: dict[int, int] = {}
    while True:
        message = _receive(sock)
        if message is None:
            return
        request, _ = message
        _reap(statuses)
        if request.get("op") == "spawn":
            submission = submissions.get(request.get("key"))
            if submission is None:
                _send(sock, {"error": f"no submission {request.get('key')!r}"})
                continue
            pid, fds = _fork_worker(sock, submission, request["request"], run_worker)
            _send(sock, {"pid": pid}, fds)
            for fd in fds:
                os.close(fd)
        elif request.get("op") == "status":
            killed = _wait_for(request["pid"], statuses)
            _send(sock, {"status": statuses[request["pid"]], "killed": killed})
        elif request.get("op") == "copy":
            pid, fd = _fork_copy(sock, submissions, run_worker, request.get("preload", []))
            _send(sock, {"pid": pid}, [fd])
            os.close(fd)


def _fork_copy(sock: socket.socket, submissions: dict[str, Submission],
               run_worker: Callable[[Submission, int, int, dict], None],
               preload: list[str]) -> tuple[int, int]:
    """Fork a server like this one that first imports ``preload``; returns
    its pid and the grader's end of its socket."""
    grader_end, copy_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            sock.close()
            grader_end.close()
            for name in preload:
                # One that will not import fails the same way in the worker
                # that needs it, against that submission only.
                with contextlib.suppress(Exception):
                    importlib.import_module(name)
            _serve(copy_end, submissions, run_worker)
        finally:
            reaping.stop_descendants()
            os._exit(0)
    copy_end.close()
    return pid, grader_end.detach()


def _fork_worker(sock: socket.socket, submission: Submission, request: dict,
                 run_worker: Callable[[Submission, int, int, dict], None]) -> tuple[int, list[int]]:
    """Fork one worker; returns its pid and the grader's ends of its pipes."""
    to_child_read, to_child_write = os.pipe()
    from_child_read, from_child_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into the server's loop
        try:
            for fd in (sock.fileno(), to_child_write, from_child_read):
                os.close(fd)
            run_worker(submission, to_child_read, from_child_write, request)
        finally:
            os._exit(0)
    os.close(to_child_read)
    os.close(from_child_write)
    return pid, [to_child_write, from_child_read]


def _wait_for(pid: int, statuses: dict[int, int]) -> bool:
    """Reap ``pid`` into ``statuses``, killing it after ``GRACE_SECONDS``;
    returns whether it had to be killed."""
    deadline = time.monotonic() + GRACE_SECONDS
    while pid not in statuses:
        try:
            ended, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not a worker of this server
            statuses[pid] = 0
            return False
        if ended:
            statuses[pid] = status
            return False
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            statuses[pid] = os.waitpid(pid, 0)[1]
            return True
        time.sleep(0.001)
    return False


def _reap(statuses: dict[int, int]) -> None:
    """Collect the exit status of every worker that has ended, without waiting."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = status


def _blank_inherited_fds(keep: int) -> None:
    """Point every descriptor inherited from the grader but the standard
    streams and ``keep`` at /dev/null: no worker can write into the grader's
    output files or a process pool's pipes. (Not closed: a Python object
    that owns one would close whatever later reused its number.)"""
    listing = next((folder for folder in ("/proc/self/fd", "/dev/fd") if os.path.isdir(folder)), None)
    if listing is None:
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir(listing):
        fd = int(name)
        if fd > 2 and fd not in (keep, devnull):
            with contextlib.suppress(OSError):
                os.fstat(fd)  # the listing's own descriptor is gone by now
                os.dup2(devnull, fd)
    os.close(devnull)
