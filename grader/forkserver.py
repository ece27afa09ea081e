"""A small process that forks every worker, so the grader forks only once;
and the clean process that forks every fork server.

A fork is not free for the process that forks: afterwards every page it
writes to is copied, and a grader that forked a worker per exercise copied
its working set (pytest, the checks, the reference) once per fork, about
80,000 page faults for a whole course. A grading process has a fork server
forked before it runs its first checks, which then sits idle but for its
forks: forking from it leaves the grader's memory alone, and the reaping of
killed workers happens there too. It never runs student code itself: only
its children do (``grader.worker``).

A worker can read every byte of its own memory, and a fork inherits all of
its parent's, freed strings included. So no fork server is forked from a
process that has read a secret (a hidden check, an oracle, a reference
solution, a known bug, a recorded answer): each command of the grader forks
the *clean parent* first (``clean_parent``), before it reads or imports any
of them, and every fork server of the command is forked from that one, on
request. The submissions a server serves reach it as data over its socket,
not by inheritance. A process forked by the grader (a chapter graded side
by side, a student of a batch) gets a connection of its own to the clean
parent (``handoff``, used by ``side_by_side.fork_answering``). Where no clean
parent was started (``grading.grade`` called as a library, the test suite),
a fork server is forked from the process that asks for it.

The clean parent stops what it forked: a server whose grader closed it, or
every server of a connection that ended or was stopped (``stop_servers_of``),
with everything below them; it is the subreaper of all of it.

Protocol, over Unix socket pairs: each message is a 4-byte length and a
JSON object, followed by raw bytes where the object says ``payload`` (a
pickle, between the grader's own processes only). A ``spawn`` answer
carries the grader's ends of the worker's two pipes as passed file
descriptors (SCM_RIGHTS); a ``server`` or ``connect`` answer, the grader's
end of a new socket.
"""

from __future__ import annotations

import contextlib
import copyreg
import ctypes
import dataclasses
import gc
import importlib
import io
import json
import marshal
import os
import pickle
import select
import shutil
import signal
import socket
import struct
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from grader import reaping
from grader.loading import Submission

_LENGTH = struct.Struct("!I")
_MAX_FDS = 2
GRACE_SECONDS = 1.0  # for a worker whose pipe closed, or the server, to end by itself
ANSWER_SECONDS = 10.0  # for the server to answer a request: it forks, or reaps, at once
# A preloaded copy imports before its first answer, and a clean parent with a preload
# before it forks a server: torch._dynamo is two seconds of CPU time, over twenty by
# the clock with 4 busy processes a core. No student code has run below either yet,
# so a long wait can only be for the imports.
IMPORT_SECONDS = 120.0


class ForkServerError(RuntimeError):
    """The fork server stopped answering: killed, stopped, or a bug of the grader."""


class ForkServer:
    """Forks workers for the given submissions on request.

    Every request has a deadline (``ANSWER_SECONDS``, wall time: the server
    only forks, which takes a fraction of a second even on a loaded machine;
    a preloaded copy's first answer ``IMPORT_SECONDS`` more): a server that
    misses it is killed, and the next request starts a new one. It is forked
    from the clean parent where this process has one (``clean_parent``),
    else from this process.

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
        self._link: _Link | None = None  # the clean parent's connection it was asked of
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
        """Have the clean parent fork the server, else fork it from this
        process; or have the parent server fork a copy."""
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
        self._link = _LINK
        if self._link is not None:
            self.pid, self._socket = self._link.fork_server()
            try:  # what it serves, as data: it inherited nothing of this process
                _send(self._socket, {"op": "setup"}, payload=_pickled((
                    {key: _as_sent(submission) for key, submission in self._submissions.items()},
                    self._run_worker)))
            except OSError as error:
                self._stop()
                raise ForkServerError(f"the fork server did not take its submissions: {error}") from None
            return
        self.pid, self._socket = _fork_serving(lambda sock: _serve(sock, self._submissions, self._run_worker))
        self._socket.settimeout(ANSWER_SECONDS)

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
        if self._link is not None:
            # The clean parent's child: it waits for the server as below,
            # and stops what the server left behind. Gone, it took them along.
            with contextlib.suppress(ForkServerError):
                self._link.ask({"op": "end", "pid": self.pid})
            return
        _wait_or_kill(self.pid)

    def _ask(self, message: dict) -> tuple[dict, list[int]]:
        """One request and its answer. A server that fails to answer is
        stopped at once: a late answer would be read as the next one's."""
        if self._socket is None:
            raise ForkServerError("the fork server is closed")
        answer, problem = _exchange(self._socket, message, "the fork server")
        if answer is None:
            self._stop()
            raise ForkServerError(problem)
        self._socket.settimeout(ANSWER_SECONDS)  # a copy's imports are done
        return answer


def _exchange(sock: socket.socket, message: dict, who: str) -> tuple[tuple[dict, list[int]] | None, str]:
    """Send one request and read its answer, within the socket's timeout:
    ``(answer, "")``, or ``(None, what went wrong)``, ``who`` named."""
    try:
        _send(sock, message)
        answer = _receive(sock)
    except TimeoutError:
        return None, f"{who} did not answer within {sock.gettimeout():g} s"
    except OSError as error:
        return None, f"{who} failed: {error}"
    return (answer, "") if answer is not None else (None, f"{who} ended")


def _send(sock: socket.socket, message: dict, fds: Sequence[int] = (), payload: bytes = b"") -> None:
    if payload:
        message = {**message, "payload": len(payload)}
    data = json.dumps(message).encode()
    frame = _LENGTH.pack(len(data)) + data + payload
    sent = socket.send_fds(sock, [frame], list(fds)) if fds else sock.send(frame)
    if sent < len(frame):
        sock.sendall(frame[sent:])


def _receive(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """One message and the descriptors that came with it; None at end of
    file. A message's payload, if any, is its ``payload`` (bytes)."""
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
    data = _receive_exactly(sock, size)
    if data is None:
        return None
    message = json.loads(data)
    if "payload" in message:
        message["payload"] = _receive_exactly(sock, message["payload"])
        if message["payload"] is None:
            return None
    return message, fds


def _receive_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(min(remaining, 2**20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


# What a clean parent's server gets sent. Pickle, since only the grader's own
# processes hold the ends of these sockets (a server's workers close theirs).
# Compiled code goes as marshal's bytes, which pickle does not do on its own.
_REDUCERS = {**copyreg.dispatch_table, types.CodeType: lambda code: (marshal.loads, (marshal.dumps(code),))}


def _pickled(value: object) -> bytes:
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _REDUCERS
    pickler.dump(value)
    return buffer.getvalue()


def _as_sent(submission: Submission) -> Submission:
    """A submission as a worker needs it: each statement's compiled code,
    without its syntax tree (the grader's, for the static scan; most of the
    cost of sending a file)."""
    return dataclasses.replace(submission, statements=[(line, code, None)
                                                       for line, code, _ in submission.statements])


# -- the server's side ----------------------------------------------------------


def _serve(sock: socket.socket, submissions: dict[str, Submission] | None,
           run_worker: Callable[[Submission, int, int, dict], None] | None) -> None:
    """A server's loop; one forked by the clean parent (``submissions``
    None) is first sent its submissions and ``run_worker``."""
    _keep_apart(sock)
    # What a worker leaves behind (where the OS let it start processes) is
    # this server's to end, when it ends.
    reaping.adopt_orphans()
    if submissions is None:
        setup = _receive(sock)
        if setup is None or setup[0].get("op") != "setup":
            return
        submissions, run_worker = pickle.loads(setup[0]["payload"])
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


def _keep_apart(sock: socket.socket) -> None:
    """What a server (and the clean parent) does first: leave Ctrl-C to the
    grader, die with its parent, hold no descriptor of the grader's but
    ``sock``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the grader's to handle
    with contextlib.suppress(OSError, AttributeError):  # Linux only: die with the grader
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    _blank_inherited_fds(keep=sock.fileno())


def _fork_copy(sock: socket.socket, submissions: dict[str, Submission],
               run_worker: Callable[[Submission, int, int, dict], None],
               preload: list[str]) -> tuple[int, int]:
    """Fork a server like this one that first imports ``preload``; returns
    its pid and the grader's end of its socket."""
    def serve(copy_end: socket.socket) -> None:
        sock.close()
        import_all(preload)
        _serve(copy_end, submissions, run_worker)

    pid, grader_end = _fork_serving(serve)
    return pid, grader_end.detach()


def import_all(names: Iterable[str]) -> None:
    """Import each of ``names``, here and now (a server's, the clean
    parent's or a command's preload). One that will not import fails the
    same way in the worker that needs it, against that submission only."""
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _fork_serving(serve: Callable[[socket.socket], None]) -> tuple[int, socket.socket]:
    """Fork a child that runs ``serve(its end of a new socket pair)``, then
    stops everything below it and ends; returns its pid and this process's end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sys.stdout.flush()  # else the copy's buffers hold this process's pending output too
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns into the caller's code
        try:
            ours.close()
            serve(theirs)
        finally:
            reaping.stop_descendants()
            os._exit(0)
    theirs.close()
    return pid, ours


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


# -- the clean parent -------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """What a fork server forked by the clean parent starts with: the
    modules imported there, and its address space in bytes (0: unknown)."""

    modules: frozenset[str]
    address_space: int


class _Link:
    """This process's connection to the clean parent. A process forked from
    this one shares its socket and must not use it (``handoff``)."""

    def __init__(self, sock: socket.socket, origin: Origin | None = None):
        self.socket: socket.socket | None = sock
        self.owner = os.getpid()
        self.origin = origin  # asked for once, when first needed
        self.handed: dict[int, int] = {}  # child pid -> the id of the connection handed to it
        self.preloaded = False  # whether the clean parent has answered a request that waits for its preload

    def ask(self, message: dict) -> tuple[dict, list[int]]:
        """One request and its answer, within ``ANSWER_SECONDS``; the first
        one that waits for the clean parent's preload (a fork server, the
        origin: ``_CleanParent.ready``) within ``IMPORT_SECONDS`` more. A
        clean parent that fails to answer is not asked again: this process
        then forks no fork server at all (none from itself, which is not clean)."""
        if self.socket is None or self.owner != os.getpid():
            raise ForkServerError("the clean parent of the fork servers is gone")
        waits = message.get("op") in ("server", "origin") and not self.preloaded
        self.socket.settimeout(ANSWER_SECONDS + IMPORT_SECONDS if waits else ANSWER_SECONDS)
        answer, problem = _exchange(self.socket, message, "the clean parent of the fork servers")
        if answer is None:
            self.close()
            raise ForkServerError(problem)
        self.preloaded = self.preloaded or waits
        return answer

    def fork_server(self) -> tuple[int, socket.socket]:
        """A new fork server, waiting for its submissions: its pid and socket."""
        answer, fds = self.ask({"op": "server"})
        if len(fds) != 1 or "pid" not in answer:
            for fd in fds:
                os.close(fd)
            raise ForkServerError(answer.get("error", "the clean parent sent no fork server"))
        server = socket.socket(fileno=fds[0])
        server.settimeout(ANSWER_SECONDS)
        return answer["pid"], server

    def origin_now(self) -> Origin:
        if self.origin is None:
            answer, _ = self.ask({"op": "origin"})
            self.origin = Origin(frozenset(answer["modules"]), answer["address_space"])
        return self.origin

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()
            self.socket = None


# The connection fork servers are asked through; None where no clean parent
# was started (they are forked from the process that asks, then). One that
# failed, or a parent's that a child was not handed one of, fails every
# request: such a process gets no fork server rather than one forked from
# itself, whose memory may hold anything by now.
_LINK: _Link | None = None


@contextlib.contextmanager
def clean_parent(preload: Sequence[str] = ()) -> Iterator[None]:
    """Fork, now, the process that forks every fork server asked for in
    this block (by this process, or by one it forks through ``handoff``);
    stop it, and everything it forked, at the block's end.

    Call it at the start of a command, before anything secret is read or
    imported, after what workers need is imported (torch, ``grader.worker``):
    every worker inherits the memory of this moment and nothing later.
    Inside a block where this process already has one, it does nothing.

    The clean parent imports ``preload`` as it starts, on a core of its
    own while this process goes on; the servers it forks wait for them and
    start with them, instead of each importing them again
    (``ForkServer.preloaded_copy``).
    """
    global _LINK
    if _LINK is not None and _LINK.owner == os.getpid():
        yield
        return
    before = _LINK
    pid, grader_end = _fork_serving(lambda root: _be_the_clean_parent(root, preload))
    _LINK = link = _Link(grader_end)  # its requests' time limits are _Link.ask's
    try:
        yield
    finally:
        _LINK = before
        link.close()  # it stops every server it forked and ends
        _wait_or_kill(pid)


def servers_origin() -> Origin | None:
    """What the fork servers this process asks for start with, where they
    come from the clean parent; None where they are forked from this process
    (which then has ``sys.modules`` imported). Raises ForkServerError when
    the clean parent does not answer."""
    return _LINK.origin_now() if _LINK is not None else None


@dataclass
class Handoff:
    """A connection to the clean parent for a process about to be forked."""

    socket: socket.socket
    id: int
    origin: Origin | None


def handoff() -> Handoff | None:
    """A connection of its own for a child this process is about to fork,
    so that it may ask for fork servers too (two processes cannot share
    one); None where this process has no clean parent. After the fork, the
    child calls ``take(handoff)``, this process ``given(handoff, pid)``."""
    if _LINK is None:
        return None
    answer, fds = _LINK.ask({"op": "connect"})
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ForkServerError("the clean parent sent no connection")
    connection = socket.socket(fileno=fds[0])
    return Handoff(connection, answer["id"], _LINK.origin)


def take(handoff: Handoff | None) -> None:
    """In the forked child: use the connection handed to it from now on."""
    global _LINK
    if handoff is None:
        return
    if _LINK is not None and _LINK.socket is not None:
        _LINK.socket.close()  # the parent's: this closes this process's copy only
    _LINK = _Link(handoff.socket, handoff.origin)


def given(handoff: Handoff | None, pid: int) -> None:
    """In the parent, after the fork: the connection is the child's now."""
    if handoff is None or _LINK is None:
        return
    handoff.socket.close()
    _LINK.handed[pid] = handoff.id


def stop_servers_of(pid: int) -> None:
    """Stop every fork server that the child ``pid`` (and whatever it forked
    in turn) had the clean parent fork, with all below them, and wait for
    it: for the child that ended or was killed before it closed them."""
    if _LINK is None or pid not in _LINK.handed:
        return
    with contextlib.suppress(ForkServerError):
        _LINK.ask({"op": "stop", "id": _LINK.handed.pop(pid)})


def address_space() -> int:
    """This process's virtual memory size; 0 where /proc does not tell (macOS)."""
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _wait_or_kill(pid: int) -> None:
    """Reap the child ``pid``, killed if it has not ended within ``GRACE_SECONDS``."""
    deadline = time.monotonic() + GRACE_SECONDS
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(pid, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)  # killed: returns at once
                return
            time.sleep(0.001)


# -- the clean parent's side


@dataclass
class _Connection:
    socket: socket.socket
    parent: int | None  # the id of the connection it was asked for through; None: the grader's own


class _CleanParent:
    """Forks bare servers on request, and stops them when their grader
    closes them, or when the connection that asked for them ends or is
    stopped; ends with the grader's own connection (id 0)."""

    def __init__(self, root: socket.socket, preload: Sequence[str]):
        # The imports run beside the loop, so that the grader's first
        # requests (a connection for each process it forks) are answered at
        # once; nothing is forked before they are done (``ready``).
        self.preloading: threading.Thread | None = None
        if preload:
            self.preloading = threading.Thread(target=import_all, args=(preload,), daemon=True)
            self.preloading.start()
        self.origin: dict | None = None
        self.connections = {0: _Connection(root, None)}
        self.by_fd = {root.fileno(): 0}
        self.next_id = 1  # never reused: a stale id names nothing
        self.servers: dict[int, int] = {}  # pid -> the id of the connection it was forked for
        self.statuses: dict[int, int] = {}
        self.poller = select.poll()
        self.poller.register(root, select.POLLIN)

    def serve(self) -> None:
        while True:
            # One request a poll: answering one may close descriptors, and
            # open others under the same numbers, that the rest were about.
            fd, _ = self.poller.poll()[0]
            asker = self.by_fd[fd]
            try:
                message = _receive(self.connections[asker].socket)
            except OSError:
                message = None
            _reap(self.statuses)
            if message is None:  # the grader, or one of its processes, ended
                if asker == 0:
                    self.stop_servers(set(self.servers))
                    return
                self.drop(self.family(asker))
                continue
            request, fds = message
            for passed in fds:
                os.close(passed)
            try:
                self.answer(request, asker)
            except OSError:  # it went away meanwhile: as at its end of file
                self.drop(self.family(asker) - {0})

    def answer(self, request: dict, asker: int) -> None:
        """Do what one request asks, and answer it."""
        sock, op = self.connections[asker].socket, request.get("op")
        if op == "origin":
            _send(sock, self.ready())
        elif op == "connect":
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            new, self.next_id = self.next_id, self.next_id + 1
            self.connections[new] = _Connection(ours, asker)
            self.by_fd[ours.fileno()] = new
            self.poller.register(ours, select.POLLIN)
            _send(sock, {"id": new}, [theirs.fileno()])
            theirs.close()
        elif op == "server":
            self.ready()
            pid, fd = self.fork_bare_server()
            self.servers[pid] = asker
            _send(sock, {"pid": pid}, [fd])
            os.close(fd)
        elif op == "end":
            pid = request.get("pid")
            if pid in self.servers:
                killed = _wait_for(pid, self.statuses)
                del self.servers[pid]
                if killed or os.WIFSIGNALED(self.statuses[pid]):
                    self.stop_servers(set())  # what it could not stop itself
            _send(sock, {"ended": pid})
        elif op == "stop":
            family = self.family(request.get("id")) - {asker, 0}
            self.drop(family)
            _send(sock, {"stopped": sorted(family)})
        else:
            _send(sock, {"error": f"no such request: {op!r}"})

    def ready(self) -> dict:
        """Wait for the preload's imports, once: a process forked while
        another thread imports would inherit the module locks it holds.
        Returns what every server starts with (``Origin``)."""
        if self.origin is None:
            if self.preloading is not None:
                self.preloading.join()
                gc.freeze()  # what was imported too, as in ``_be_the_clean_parent``
            self.origin = {"modules": sorted(sys.modules), "address_space": address_space()}
        return self.origin

    def family(self, first: int | None) -> set[int]:
        """The connection ``first`` and every one asked for through it, in turn."""
        found = {first} & set(self.connections)
        while True:
            more = {key for key, connection in self.connections.items() if connection.parent in found} - found
            if not more:
                return found
            found |= more

    def drop(self, ids: set[int]) -> None:
        """Close these connections and stop the servers forked for them."""
        for key in ids:
            connection = self.connections.pop(key)
            self.poller.unregister(connection.socket)
            del self.by_fd[connection.socket.fileno()]
            connection.socket.close()
        self.stop_servers({pid for pid, key in self.servers.items() if key in ids})

    def stop_servers(self, stopping: set[int]) -> None:
        """Kill the servers ``stopping`` and everything below them, then every
        other process below this one that no remaining server owns: what a
        killed server's workers left behind came to this process, the subreaper."""
        for pid in stopping:
            reaping.stop_tree(pid)
            del self.servers[pid]
        children = _children()
        if children is not None and children <= set(self.servers):
            return  # nothing left behind: no need to walk every process
        alive = set(self.servers)
        reaping.stop_descendants(spare=frozenset(entry for entry in reaping.descendants() if entry[0] in alive))

    def fork_bare_server(self) -> tuple[int, int]:
        """Fork a server that waits for its submissions (``_serve``); returns
        its pid and the grader's end of its socket."""
        def serve(server_end: socket.socket) -> None:
            for connection in self.connections.values():
                connection.socket.close()
            _serve(server_end, None, None)

        pid, grader_end = _fork_serving(serve)
        return pid, grader_end.detach()


def _be_the_clean_parent(root: socket.socket, preload: Sequence[str]) -> None:
    _keep_apart(root)
    reaping.adopt_orphans()
    gc.freeze()  # as a server does: what it forks then copies less
    _CleanParent(root, preload).serve()


def _children() -> set[int] | None:
    """This process's children, from /proc (None where it does not tell)."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children", encoding="ascii") as listing:
            return {int(pid) for pid in listing.read().split()}
    except OSError:
        return None

