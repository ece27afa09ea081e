"""``mha-course watch``: grade a chapter's file again each time it is saved.

One process keeps torch, pytest and the checks imported, so a regrade costs
only the grading itself. Each regrade is a whole ``grading.grade`` of the
files as saved: workers forked for it, as ``mha-course grade`` forks them,
so the watcher never runs a line of the student's code in its own process.

Saves are found by polling the files' size and modification time every
``POLL`` seconds. A watcher has one to a few files to look at; a ``stat``
of each costs microseconds, works the same on Linux, macOS, Windows, WSL
and network or container mounts (where inotify misses changes made on the
other side), and needs no dependency. A file library's events would save
nothing that a person can notice at this rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

POLL = 0.05  # seconds between looks at the files
# A save is graded once the files have looked the same for this long: an
# editor that writes a file in several steps (truncate, write, rename) is
# not caught half way.
SETTLE = 0.05
# And an empty file for this long: the truncation is the first of those
# steps, and on a busy machine the write after it may come more than SETTLE
# later. Nobody waits on purpose for the grade of an empty file.
SETTLE_EMPTY = 1.0

Signature = tuple[tuple[int, int] | None, ...]


def signature(paths: Iterable[Path]) -> Signature:
    """Each file's ``(modification time in ns, size)``, None where there is none."""
    found = []
    for path in paths:
        try:
            status = path.stat()
        except OSError:
            found.append(None)
        else:
            found.append((status.st_mtime_ns, status.st_size))
    return tuple(found)


def next_save(paths: Sequence[Path], last: Signature, sleep: Callable[[float], None] = time.sleep) -> Signature:
    """Wait until the files differ from ``last`` and then stay unchanged for
    ``SETTLE`` seconds (``SETTLE_EMPTY`` while one is empty); their signature then."""
    while True:
        sleep(POLL)
        now = signature(paths)
        if now == last:
            continue
        sleep(SETTLE_EMPTY if any(found is not None and found[1] == 0 for found in now) else SETTLE)
        settled = signature(paths)
        if settled == now:
            return now


def watch(paths: Callable[[], Sequence[Path]], regrade: Callable[[], None],
          rounds: int | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
    """Call ``regrade`` now and after every save of one of ``paths()``.

    Args:
        paths: the files to watch, asked again after each regrade (a chapter
            may move from its ``.py`` to its notebook).
        regrade: grades the files as they are now and prints the report.
        rounds: stop after this many regrades (a test's); None runs until
            Ctrl-C, whose ``KeyboardInterrupt`` reaches the caller.
    """
    done = 0
    while rounds is None or done < rounds:
        watched = list(paths())
        last = signature(watched)
        regrade()
        done += 1
        if rounds is not None and done >= rounds:
            return
        # A save made while the grade ran is seen at once: its signature differs.
        if signature(watched) == last:
            next_save(watched, last, sleep)
