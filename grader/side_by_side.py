"""Grade chapters side by side, one process per core, forked from this one.

Grading is a chain: a check asks a worker, waits, compares, asks again. One
chain keeps about one core busy, so a whole-course grade on two cores runs
two chains: this process and a forked copy of it (torch and pytest are
imported already, so the copy is cheap). Each takes the next
chapter from a shared queue when it is done with one, so a heavy chapter
does not leave a core idle. Only trusted grader code runs in the copies;
student code still runs in workers, whose fork servers the clean parent
forks for each copy as for this process (``forkserver.handoff``). What a
copy found comes back pickled through a pipe: from our own process, never
from a worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from typing import TypeVar

import torch

from grader import forkserver

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")
Shared = TypeVar("Shared")


class ForkedCopyDied(RuntimeError):
    """A forked grading process died; the message says how."""


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Compute on one thread inside the block (grading, here and in workers).

    The checks' tensors are small: on several threads, torch's many small
    operations spend their time waiting on each other, many times slower
    than on one, the more so on a loaded machine. One thread also
    makes a recorded student edition's arithmetic the same on every machine,
    and a process forked while OpenMP's threads exist may hang in them.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def forked_pool(jobs: int) -> ProcessPoolExecutor:
    """A pool of ``jobs`` processes forked from this one, for the grader's
    own work side by side (verify's known bugs, a release's seeds): each
    inherits torch, already imported, and computes on one thread, since a
    process forked while OpenMP's threads exist may hang in them."""
    return ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=multiprocessing.get_context("fork"),
                               initializer=torch.set_num_threads, initargs=(1,))


def default_processes() -> int:
    """How many processes grade side by side: one more than the cores this
    process may use, since each spends part of its time waiting on a worker."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1 if cores > 1 else 1


def run_side_by_side(items: Sequence[Item], work: Callable[[Item, Shared], Outcome], processes: int,
                     shared: Callable[[], AbstractContextManager[Shared]] = contextlib.nullcontext,
                     ) -> list[Outcome]:
    """``[work(item, s) for item in items]``, computed by up to ``processes``
    processes (this one and forked copies), each taking the next item in
    order when it is done with one: put the heaviest first. ``s`` is what
    ``shared()`` gives as a context manager, entered once in each process
    that takes an item (the fork server it forks workers from).

    ``work``'s results must pickle. Raises what ``work`` raised, here or in a
    copy, or ForkedCopyDied when a copy died.
    """
    processes = max(1, min(processes, len(items)))
    if processes == 1:
        with shared() as value:
            return [work(item, value) for item in items]
    if len(items) > 255:
        raise ValueError("at most 255 items")
    # The queue: one byte per item in a pipe. A read of one byte is atomic,
    # so no two processes take the same item; an empty read means no more.
    queue_read, queue_write = os.pipe()
    os.write(queue_write, bytes(range(len(items))))
    os.close(queue_write)
    children: list[tuple[int, int]] = []
    try:
        with one_thread():  # the cores are shared out between the processes
            for _ in range(processes - 1):
                children.append(_fork(items, work, shared, queue_read))
            done = dict(_take_and_work(items, work, shared, queue_read))
        while children:
            pid, read_fd = children.pop(0)
            try:
                done.update(_collect(pid, read_fd))
            finally:
                forkserver.stop_servers_of(pid)  # those of a copy that died before it closed them
        return [done[index] for index in range(len(items))]
    finally:
        os.close(queue_read)
        for pid, read_fd in children:  # left over when something failed
            os.kill(pid, signal.SIGKILL)
            os.close(read_fd)
            os.waitpid(pid, 0)
            forkserver.stop_servers_of(pid)


def _take_and_work(items: Sequence[Item], work: Callable[[Item, Shared], Outcome],
                   shared: Callable[[], AbstractContextManager[Shared]], queue: int,
                   ) -> list[tuple[int, Outcome]]:
    taken = os.read(queue, 1)
    if not taken:  # the others took everything
        return []
    done = []
    with shared() as value:
        while taken:
            done.append((taken[0], work(items[taken[0]], value)))
            taken = os.read(queue, 1)
    return done


def _fork(items: Sequence[Item], work: Callable[[Item, Shared], Outcome],
          shared: Callable[[], AbstractContextManager[Shared]], queue: int) -> tuple[int, int]:
    def compute() -> tuple[str, object]:
        torch.set_num_threads(1)  # as its parent does (one_thread)
        try:
            return "ok", _take_and_work(items, work, shared, queue)
        except BaseException as error:  # noqa: BLE001 - raised again in the parent
            try:
                pickle.dumps(error)
            except Exception:  # an exception that does not pickle: its words, then
                error = ForkedCopyDied(f"{type(error).__name__}: {error}")
            return "error", error

    return fork_answering(compute)


def fork_answering(compute: Callable[[], object]) -> tuple[int, int]:
    """Fork a copy of this process that sends back ``pickle.dumps(compute())``
    through a pipe (nothing, if it dies first) and ends; returns its pid and
    the pipe's end to read the answer from. Only the grader's own code may
    run in ``compute``: the caller unpickles what comes back.

    Where this process has a clean parent, the copy gets a connection of
    its own to it: its fork servers come from there too. Once the copy has
    ended (or been killed), ``forkserver.stop_servers_of(pid)`` makes sure
    they have too."""
    handoff = forkserver.handoff()
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()  # else the copy's buffers hold this process's pending output too
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns into the caller's code
        try:
            os.close(read_fd)
            forkserver.take(handoff)
            data = pickle.dumps(compute())
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(data)
        finally:
            os._exit(0)
    os.close(write_fd)
    forkserver.given(handoff, pid)
    return pid, read_fd


def _collect(pid: int, read_fd: int) -> list[tuple[int, object]]:
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise ForkedCopyDied(f"a grading process died (wait status {status})")
    kind, value = pickle.loads(data)
    if kind != "ok":
        raise value
    return value
