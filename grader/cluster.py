"""Grade a class on a Dask cluster: ``mha-course batch SUBMISSIONS --cluster ADDRESS``.

Why: one machine grades a whole-course submission every few seconds; a class of
thousands, or a regrade of every term after a check changes, wants many. A
Dask scheduler (``dask scheduler``, or one that dask-jobqueue starts on
Slurm or PBS, or dask-kubernetes) hands each student to one of its workers,
on as many machines as there are. Everything else is ``batch``'s own
(``grader.batch.run_batch``): the out folder, the signed state, the CSV, the
results JSON, the summary, regrading only what changed. Only where a
student is graded differs: ``grade_on_cluster`` has ``batch.grade_each``'s
contract, and ``run_batch(..., elsewhere=on_cluster(ADDRESS))`` calls it instead.

What travels, and in what shape:

* client to worker, one Dask task a student: a ``Parcel`` (the student's
  id, content hash and size, and the entry's files as bytes: a folder's
  chapter files with their paths and modification times and the names of
  what else is at its top, a zip's bytes, loose files), the
  ``GradingOptions``, this course's grader fingerprint and the seconds the
  task may wait for its grade. Files, never paths: a worker may be another
  machine with no shared file system. The worker unpacks the parcel into a
  temporary folder under the same names, so that every note and every
  "graded FILE (why)" names the files as the student does, as a local batch
  would.
* worker to client: a tuple, ``("graded", pickled StudentGrade or None
  when the grading process died, what the worker's sandbox lacks)``,
  ``("stopped", why)`` when the grading service died or gave no answer in
  time (that student's row says so and the next run grades it again), or
  ``("other-grader", its fingerprint, worker)``: the worker has other
  checks, known bugs or solutions, and the batch stops (``ClusterError``)
  rather than mix another version's grades into the CSV.

On a worker, the task never forks the worker's own process (threads:
tornado's, a thread pool) and never runs student code in it. It hands the
parcel to a grading *service* (``serve``: ``python -m grader.cluster
serve``), a subprocess started once per worker thread and kept, which does
what ``run_batch`` does before grading locally: computes the fingerprint
apart, preloads the chapters' imports, enters the clean parent, collects the
checks once; then for each request it calls ``batch.grade_each([entry],
options, 1, ...)``. So each student is graded in the sandbox of a local
batch: a process forked per student, workers forked from the clean parent,
Landlock, seccomp, rlimits, ``student_seconds``. Requests and answers are
length-prefixed pickles on the service's stdin and stdout, written by grader
code only. The service dies with the worker thread that started it
(``PR_SET_PDEATHSIG``) and ends at the end of its stdin; one for other
chapters or another ``--timeout`` is replaced.

A worker that dies costs its student a retry, never the batch: the
scheduler gives the task to another worker (up to its ``allowed-failures``).
A task not answered within ``student_seconds`` and a margin gets a row that
says so, and the batch goes on.

Deploying: ``dask scheduler`` on one machine; on each machine that grades,
this same course installed (``pip install -e ".[cluster]"``) and ``dask
worker tcp://SCHEDULER:8786 --nthreads N``, N about its cores (a student's
grading keeps about one core busy); then ``mha-course batch SUBMISSIONS
--cluster tcp://SCHEDULER:8786``. The client sends as many students at once
as the cluster has threads, largest first, as a local batch's ``--jobs``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from grader.batch_state import StudentGrade, grader_fingerprint
from grader.catalog import SUBMISSION_SUFFIXES, find_chapter
from grader.class_folder import Entry, is_loose
from grader.finding import holds_no_work, submission_files

# Mirrors grader.batch's; imported there lazily, so that batch imports this module only with --cluster.
MARGIN_SECONDS = 30.0  # beyond student_seconds: unpacking, forking, pickling, the wire
SERVICE_START_SECONDS = 300.0  # a service's start: torch, the chapters' imports, the checks' collection
WORKERS_SECONDS = 60.0  # how long the batch waits for a worker, at its start or when all have left
MAX_PARCEL_BYTES = 64 * 2**20  # a class's exercises are a few hundred kilobytes (class_folder's cap: 50 MB)
_REFRESH_SECONDS = 2.0  # how often the client asks how many threads the cluster has
_FRAME = struct.Struct("!Q")
_PR_SET_PDEATHSIG = 1

PIP_HINT = 'batch --cluster needs Dask\'s distributed: pip install -e ".[cluster]"'


class ClusterError(Exception):
    """The batch cannot go on on this cluster (unreachable, no workers, a
    worker of another version of the course); the message says why, in one
    line. What was graded before is kept."""


def available() -> bool:
    """Is Dask's ``distributed`` installed (the ``cluster`` extra)?"""
    return importlib.util.find_spec("distributed") is not None


# -- what travels: a student's files ------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One path of a parcel, relative to the folder it is unpacked into.

    ``kind``: ``"file"`` (``data``, modification time ``mtime_ns``),
    ``"folder"``, ``"name"`` (something whose name only counts: a file the
    grader never reads, unpacked empty), ``"link"`` and ``"special"``
    (never read, never graded: unpacked as a dangling link and a FIFO, so
    that the reason names them as locally), ``"unreadable"`` (unpacked as
    a file no one may read)."""

    path: str
    kind: str
    data: bytes = b""
    mtime_ns: int = 0


@dataclass(frozen=True)
class Parcel:
    """A student's entry as it travels: ``Entry``'s id, digest and size,
    the names of its paths (``tops``) and every member under them."""

    student: str
    digest: str
    size: int
    tops: tuple[str, ...]
    members: tuple[Member, ...]

    @property
    def bytes(self) -> int:
        return sum(len(member.data) for member in self.members)


class TooLarge(Exception):
    """An entry holds more than ``MAX_PARCEL_BYTES`` to send."""


def pack(entry: Entry) -> Parcel:
    """The parcel of ``entry``: what ``class_folder.submission_targets``
    reads of it, and only that (of a folder, the files ``finding`` could
    grade, and the names at its top, which a reason lists; not its data or
    checkpoints).

    Raises:
        TooLarge: it would send more than ``MAX_PARCEL_BYTES``.
    """
    paths = entry.paths
    first = paths[0]
    members: list[Member] = []
    if len(paths) == 1 and first.is_dir():
        members.append(Member(first.name, "folder"))
        files, refused = submission_files(first)
        with contextlib.suppress(OSError):  # what is at its top: a reason lists it when nothing is graded
            for child in sorted(first.iterdir()):
                if holds_no_work(child.name):
                    continue
                if child.is_dir():
                    members.append(Member(f"{first.name}/{child.name}", "folder"))
                elif child.suffix not in SUBMISSION_SUFFIXES:
                    members.append(Member(f"{first.name}/{child.name}", "name"))
        members += [_member(path, f"{first.name}/{path.relative_to(first).as_posix()}") for path in files]
        members += [_member(path, f"{first.name}/{path.relative_to(first).as_posix()}") for path in refused]
    elif len(paths) == 1 and first.suffix.lower() == ".zip":
        members.append(_member(first, first.name, follow=True))
    elif all(map(is_loose, paths)):
        members += [_member(path, path.name) for path in paths]
    else:  # not a kind of entry the batch grades: its names say so
        members += [Member(path.name, "name") for path in paths]
    parcel = Parcel(entry.student, entry.digest, entry.size, tuple(path.name for path in paths), tuple(members))
    if parcel.bytes > MAX_PARCEL_BYTES:
        raise TooLarge(f"the submission holds {parcel.bytes / 2**20:.0f} MB, more than the "
                       f"{MAX_PARCEL_BYTES // 2**20} MB a cluster's task takes")
    return parcel


def _member(path: Path, name: str, follow: bool = False) -> Member:
    """A file as ``finding`` and ``class_folder`` see it: a link or a
    special file is never opened (``follow``: a zip is read through a link,
    as ``zipfile`` does locally)."""
    if not follow and path.is_symlink():
        return Member(name, "link")
    try:
        if not path.is_file():
            return Member(name, "special")
        with open(path, "rb") as stream:
            data = stream.read(MAX_PARCEL_BYTES + 1)
        return Member(name, "file", data, path.stat().st_mtime_ns)
    except OSError:
        return Member(name, "unreadable")


def unpack(parcel: Parcel, into: Path) -> Entry:
    """Write ``parcel``'s members into the empty folder ``into``; the entry
    they make, with the parcel's id, digest and size."""
    for member in parcel.members:
        parts = PurePosixPath(member.path).parts
        if not parts or PurePosixPath(member.path).is_absolute() or ".." in parts:
            raise ValueError(f"a parcel's path leaves its folder: {member.path!r}")
        target = into.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        if member.kind == "folder":
            target.mkdir(exist_ok=True)
        elif member.kind == "link":
            os.symlink(into / ".nowhere", target)
        elif member.kind == "special":
            os.mkfifo(target)
        else:
            target.write_bytes(member.data)
            if member.kind == "file":
                os.utime(target, ns=(member.mtime_ns, member.mtime_ns))
            elif member.kind == "unreadable":
                target.chmod(0)
    return Entry(parcel.student, tuple(into / top for top in parcel.tops), parcel.digest, parcel.size)


# -- the pipe between a worker and its grading service -----------------------------


def _send(fd: int, value: object, deadline: float = float("inf")) -> None:
    data = pickle.dumps(value)
    view = memoryview(_FRAME.pack(len(data)) + data)
    while view:
        _wait(fd, deadline, write=True)
        view = view[os.write(fd, view[: 2**20]):]


def _receive(fd: int, deadline: float = float("inf"), alive: Callable[[], bool] = lambda: True) -> object:
    """The next frame's value. Raises EOFError at the end of the pipe,
    TimeoutError past ``deadline``, ChildProcessError when ``alive()``
    says the other end died (checked each second)."""
    (size,) = _FRAME.unpack(_read_exactly(fd, _FRAME.size, deadline, alive))
    return pickle.loads(_read_exactly(fd, size, deadline, alive))


def _read_exactly(fd: int, size: int, deadline: float, alive: Callable[[], bool]) -> bytes:
    chunks, left = [], size
    while left:
        _wait(fd, deadline, alive=alive)
        chunk = os.read(fd, min(left, 2**20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _wait(fd: int, deadline: float, write: bool = False, alive: Callable[[], bool] = lambda: True) -> None:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready = select.select([], [fd], [], min(left, 1.0))[1] if write else \
            select.select([fd], [], [], min(left, 1.0))[0]
        if ready:
            return
        if not alive():
            raise ChildProcessError


# -- the grading service (a subprocess of a Dask worker) ----------------------------


def serve(chapter_ids: list[str], check_seconds: float, parent: int) -> None:
    """The grading service's life: get ready as ``run_batch`` does before a
    local batch, say so (``{"fingerprint", "unprotected"}``), then grade each
    request ``(Parcel, GradingOptions)`` and answer with the pickled
    ``StudentGrade`` (None: its grading process died), until stdin ends."""
    from grader import batch, isolation
    from grader.check_runner import collected
    from grader.sandbox import clean_parent, layers, preload

    answers = os.dup(1)  # the protocol's; anything printed goes to stderr, the worker's log
    os.dup2(2, 1)
    with contextlib.suppress(OSError, AttributeError):  # Linux: die with the worker thread that started it
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before that
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    chapters = tuple(find_chapter(chapter_id) for chapter_id in chapter_ids)
    fingerprint = batch.computed_apart(grader_fingerprint)
    preload(chapters)
    with clean_parent():
        for chapter in chapters:
            collected(chapter)
        _send(answers, {"fingerprint": fingerprint, "unprotected": isolation.missing(layers())})
        while True:
            try:
                parcel, options = _receive(0)
            except EOFError:
                return
            graded: list[StudentGrade | None] = []
            with tempfile.TemporaryDirectory(prefix="mha-cluster-") as folder:
                entry = unpack(parcel, Path(folder))
                batch.grade_each([entry], options, 1, lambda _, grade: graded.append(grade))
            _send(answers, pickle.dumps(graded[0]))


def service_command(chapter_ids: tuple[str, ...], check_seconds: float) -> list[str]:
    """How a worker starts its grading service."""
    return [sys.executable, "-m", "grader.cluster", "serve", ",".join(chapter_ids), repr(check_seconds),
            str(os.getpid())]


class ServiceStopped(Exception):
    """The service died or did not answer in time; the message says which."""


class _Service:
    """A worker thread's grading service: the process, and what it said it is."""

    def __init__(self, key: tuple[tuple[str, ...], float]):
        self.key = key
        self.process = subprocess.Popen(service_command(*key), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        start_new_session=True)  # a group of its own: stopped whole
        try:
            hello = _receive(self.process.stdout.fileno(), time.monotonic() + SERVICE_START_SECONDS, self.alive)
        except (EOFError, TimeoutError, ChildProcessError, pickle.UnpicklingError):
            self.stop()
            raise ServiceStopped(f"the grading service did not start (exit status {self.process.returncode}; "
                                 "its error is in the worker's log)") from None
        self.fingerprint: str = hello["fingerprint"]
        self.unprotected: str = hello["unprotected"]

    def alive(self) -> bool:
        return self.process.poll() is None

    def grade(self, parcel: Parcel, options, seconds: float) -> bytes:
        """The pickled grade of ``parcel``. Raises ServiceStopped, having
        stopped the service, when it dies or gives no answer within ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            _send(self.process.stdin.fileno(), (parcel, options), deadline)
            return _receive(self.process.stdout.fileno(), deadline, self.alive)
        except TimeoutError:
            self.stop()
            raise ServiceStopped(f"its grading did not end within {seconds:g} s on the cluster's worker "
                                 "and was stopped") from None
        except (EOFError, ChildProcessError, BrokenPipeError, pickle.UnpicklingError):
            self.stop()
            raise ServiceStopped(f"the worker's grading service stopped while grading this submission "
                                 f"(exit status {self.process.returncode})") from None

    def stop(self) -> None:
        """End the service and everything in its group (its grading
        processes, its clean parent and fork servers; the workers these
        fork die with their server)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()  # were its group not its own
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


_THREAD = threading.local()  # a worker thread's _Service


def grade_parcel(parcel: Parcel, options, fingerprint: str, seconds: float) -> tuple:
    """The Dask task: grade one student on this worker, through this
    thread's grading service (started, or replaced, for these chapters and
    limits). See the module's docstring for what it returns."""
    from distributed import get_worker

    key = (tuple(chapter.id for chapter in options.chapters), options.check_seconds)
    service: _Service | None = getattr(_THREAD, "service", None)
    if service is not None and (service.key != key or not service.alive()):
        service.stop()
        service = _THREAD.service = None
    if service is None:
        service = _THREAD.service = _Service(key)  # raises ServiceStopped: the batch stops, this worker is broken
    if service.fingerprint != fingerprint:
        return "other-grader", service.fingerprint, get_worker().address
    try:
        return "graded", service.grade(parcel, options, seconds), service.unprotected
    except ServiceStopped as error:
        _THREAD.service = None
        return "stopped", str(error)


# -- the client: the batch's side ----------------------------------------------------


@dataclass
class _Task:
    entry: Entry
    future: object
    deadline: float


def grade_on_cluster(entries: list[Entry], options, address: str,
                     done: Callable[..., None], fingerprint: str) -> str:
    """Grade each entry as a task on the Dask cluster at ``address`` (the
    scheduler's, ``tcp://host:8786``, or its scheduler file), in order, as
    many at a time as the cluster has threads, and call ``done(entry,
    grade)`` as each ends: ``grade`` None when the grading died, with a third
    argument, why, when it was not the grading process (the worker's service
    died, no answer in time). ``fingerprint``: this course's
    (``grader_fingerprint``), which every worker's must equal.

    Returns what the workers' sandbox lacks (``isolation.missing``; "" when
    nothing).

    Raises:
        ClusterError: Dask is not installed, the scheduler cannot be
            reached, no worker joins, or a worker grades with other checks
            or solutions; the students done by then have had ``done``.
    """
    from grader.batch import student_seconds, ungraded

    if not available():
        raise ClusterError(PIP_HINT)
    if not entries:  # a re-run with nothing changed needs no cluster
        return ""
    seconds = student_seconds(options) + MARGIN_SECONDS
    backstop = seconds + SERVICE_START_SECONDS  # a task that never starts or never answers
    client = _connect(address)
    pending, running = list(entries), {}
    finished: queue.SimpleQueue = queue.SimpleQueue()
    unprotected: set[str] = set()
    try:
        threads, asked, empty_since = 0, 0.0, None
        while pending or running:
            now = time.monotonic()
            if now - asked >= _REFRESH_SECONDS:
                counted = sum(client.nthreads().values())
                if counted < threads:  # a worker left: its task starts again elsewhere
                    for task in running.values():
                        task.deadline = max(task.deadline, now + backstop)
                threads, asked = counted, now
                empty_since = None if threads else empty_since or now
                if empty_since is not None and now - empty_since > WORKERS_SECONDS:
                    raise ClusterError(f"the cluster at {address} has had no worker for "
                                       f"{WORKERS_SECONDS:g} s; {len(pending) + len(running)} students not "
                                       "graded: run the batch again when it has workers")
            while pending and len(running) < threads:
                entry = pending.pop(0)
                try:
                    parcel = pack(entry)
                except TooLarge as error:
                    done(entry, ungraded(entry, str(error), options.chapters))
                    continue
                future = client.submit(grade_parcel, parcel, options, fingerprint, seconds, pure=False,
                                       key=f"mha-course-grade-{entry.student}-{uuid.uuid4().hex[:8]}")
                running[future.key] = _Task(entry, future, time.monotonic() + backstop)
                future.add_done_callback(lambda future: finished.put(future.key))
            wait = min([task.deadline for task in running.values()] + [time.monotonic() + _REFRESH_SECONDS])
            with contextlib.suppress(queue.Empty):
                key = finished.get(timeout=max(0.0, wait - time.monotonic()))
                task = running.pop(key, None)
                if task is not None:
                    _answered(task, fingerprint, done, unprotected)
            for key, task in list(running.items()):
                if time.monotonic() > task.deadline:
                    del running[key]
                    task.future.cancel()
                    done(task.entry, None, f"the cluster did not answer within {backstop:g} s")
    except OSError as error:  # the scheduler went away
        raise ClusterError(f"lost the Dask scheduler at {address}: {_one_line(error)}") from None
    finally:
        for task in running.values():
            task.future.cancel()
        client.close()
    return " / ".join(sorted(unprotected - {""}))


def on_cluster(address: str) -> Callable[..., str]:
    """``batch.run_batch``'s ``elsewhere``: its pending students graded on
    the Dask cluster at ``address`` (``grade_on_cluster``)."""
    def grade(entries: list[Entry], options, done: Callable[..., None], fingerprint: str) -> str:
        return grade_on_cluster(entries, options, address, done, fingerprint)

    return grade


def _connect(address: str):
    """A client of the scheduler at ``address`` (or named by the scheduler
    file ``address``), with a worker to take tasks. Raises ClusterError."""
    import asyncio

    from distributed import Client

    try:
        if Path(address).is_file():
            client = Client(scheduler_file=address, set_as_default=False)
        else:
            client = Client(address, set_as_default=False)
    except (OSError, ValueError, TypeError) as error:  # refused, timed out, not an address
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: {_one_line(error)}") from None
    try:
        client.wait_for_workers(1, timeout=WORKERS_SECONDS)
    except (TimeoutError, asyncio.TimeoutError, OSError):  # not the same exception before Python 3.11
        client.close()
        raise ClusterError(f"no worker joined the Dask scheduler at {address} within {WORKERS_SECONDS:g} s") \
            from None
    return client


def _answered(task: _Task, fingerprint: str, done: Callable[..., None], unprotected: set[str]) -> None:
    """Hand a finished task's answer to ``done``; raises ClusterError where
    the batch cannot go on."""
    from distributed import KilledWorker

    future = task.future
    if future.status == "cancelled":
        done(task.entry, None, "its task on the cluster was cancelled")
        return
    error = future.exception() if future.status == "error" else None
    if isinstance(error, KilledWorker):
        done(task.entry, None, "the cluster's workers died each time they graded this submission")
        return
    if isinstance(error, ImportError):
        raise ClusterError(f"the cluster's workers cannot import the grader ({_one_line(error)}): install "
                           "this course on every worker")
    if error is not None:  # a worker that cannot grade at all (its service does not start): the batch stops
        raise ClusterError(f"a task failed on the cluster's worker: {type(error).__name__}: {_one_line(error)}")
    try:
        answer = future.result()
    except Exception as error:  # its worker left with the answer, and the scheduler could not compute it again
        done(task.entry, None, f"its answer was lost on the cluster ({type(error).__name__})")
        return
    if answer[0] == "other-grader":
        raise ClusterError(f"the worker {answer[2]} grades with other checks, known bugs or solutions than "
                           f"this course's (fingerprint {answer[1][:12]}, here {fingerprint[:12]}): install "
                           "this version of the course on every worker")
    if answer[0] == "stopped":
        done(task.entry, None, answer[1])
        return
    unprotected.add(answer[2])
    done(task.entry, pickle.loads(answer[1]))  # pickled by the service, grader code


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def main(argv: list[str]) -> None:
    """``python -m grader.cluster serve CHAPTERS CHECK_SECONDS PARENT_PID``."""
    if len(argv) != 4 or argv[0] != "serve":
        sys.exit("usage: python -m grader.cluster serve CH01,CH02 CHECK_SECONDS PARENT_PID")
    serve(argv[1].split(","), float(argv[2]), int(argv[3]))


if __name__ == "__main__":
    main(sys.argv[1:])
