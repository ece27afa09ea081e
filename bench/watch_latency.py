"""Save to table: how long ``mha-course watch`` takes to show a new grade.

Run by hand: ``python bench/watch_latency.py [--saves 20] [--chapter ch01]``.
A watcher is started on a copy of the chapter's reference solution in a
temporary folder; the file is then saved again and again, alternately with
one of the chapter's known bugs and right, each save made as an editor makes
it (a new file renamed into place), and the time from the rename to the
report's "Total:" line is recorded. Printed: the median and the spread, and
the ratio to a bare ``python -c 'import torch'``, for scale.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grade_course import REPOSITORY, machine, timed

from grader.catalog import find_chapter
from grader.known_bugs import KNOWN_BUGS, apply_bug


def until_total(lines) -> None:
    for line in lines:
        if line.startswith("Total:"):
            return
    raise SystemExit("the watcher stopped before its report")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--saves", type=int, default=20)
    parser.add_argument("--chapter", default="ch01")
    options = parser.parse_args()
    chapter = find_chapter(options.chapter)
    solution = chapter.solution().read_text(encoding="utf-8")
    versions = [apply_bug(solution, KNOWN_BUGS[chapter.id][0]), solution]
    print(machine())
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / chapter.file_name
        target.write_text(solution, encoding="utf-8")
        started = time.perf_counter()
        watcher = subprocess.Popen([sys.executable, "-m", "grader", "watch", chapter.id, "--dir", folder,
                                    "--seed", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   text=True, start_new_session=True)
        until_total(watcher.stdout)
        print(f"first report (imports included): {time.perf_counter() - started:.2f} s")
        latencies = []
        for index in range(options.saves):
            staged = target.with_suffix(".swp")
            staged.write_text(versions[index % 2], encoding="utf-8")
            saved = time.perf_counter()
            os.replace(staged, target)
            until_total(watcher.stdout)
            latencies.append(time.perf_counter() - saved)
        os.killpg(watcher.pid, signal.SIGINT)
        watcher.wait(timeout=60)
    torch_import = statistics.median(timed([sys.executable, "-c", "import torch"], REPOSITORY)[0] for _ in range(3))
    median = statistics.median(latencies)
    print(f"save to table, {chapter.id}: median {median:.3f} s (min {min(latencies):.3f}, "
          f"max {max(latencies):.3f}) over {len(latencies)} saves; target 0.5 s")
    print(f"a bare torch import: {torch_import:.2f} s; save to table is {median / torch_import:.2f} of it")


if __name__ == "__main__":
    main()
