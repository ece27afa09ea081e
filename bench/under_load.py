"""A whole-course grade of the reference solutions on a loaded machine.

Run by hand: ``python bench/under_load.py [--per-core N] [--release]``. It
starts N busy processes a core (4 by default: a pure-Python loop each),
then runs ``python -m grader grade --solutions --seed 0 --json`` beside them
and prints what it measured: the score and whether it is full marks, the
grade's wall time and CPU time (its own and that of every process it
reaped: fork servers, workers), and the load (runnable processes, sampled
from /proc/loadavg, and the load average). With ``--release`` it then runs
``mha-course release`` under the same load, into a temporary folder, and
prints its exit status and times too.

The time limits count a worker's CPU time, not the clock's (``Limits`` in
``grader/isolation.py``): under this load correct code must still get full
marks, only later. Exit status 0 when every command did its job.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def busy() -> None:
    """A process that computes forever, as another user's job would."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        pass


def start_load(count: int) -> list[int]:
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            try:
                busy()
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


def stop_load(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for pid in pids:
        os.waitpid(pid, 0)


class RunnableSampler:
    """The number of runnable processes on the machine, from /proc/loadavg
    (its fourth field, ``running/total``), every 100 ms while it runs."""

    def __init__(self):
        self.samples: list[int] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.1):
            try:
                with open("/proc/loadavg", encoding="ascii") as loadavg:
                    self.samples.append(int(loadavg.read().split()[3].split("/")[0]))
            except (OSError, ValueError, IndexError):
                return  # no /proc: the load average only

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()

    def describe(self) -> str:
        if not self.samples:
            return "runnable processes not sampled (no /proc)"
        mean = sum(self.samples) / len(self.samples)
        cores = os.cpu_count() or 1
        return (f"runnable processes: mean {mean:.1f} ({mean / cores:.1f} a core), "
                f"max {max(self.samples)}, {len(self.samples)} samples")


def timed(command: list[str]) -> tuple[int, str, float, float]:
    """Run ``command``: its exit status, its output, its wall time and the
    CPU time (user + system) of it and every process it reaped."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, output, time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def report_grade(output: str) -> bool:
    """Print the score of ``grade --json``'s output; True for full marks."""
    try:
        results = json.loads(output)
    except json.JSONDecodeError:
        print("  no JSON came back")
        return False
    full = results["score"] == results["max_score"]
    print(f"  score {results['score']} of {results['max_score']}: {'full marks' if full else 'NOT full marks'}")
    for test in results["tests"]:
        if test["score"] != test["max_score"]:
            print(f"  lost {test['max_score'] - test['score']} on {test['name']}: {test['output'][:300]}")
    return full


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-core", type=int, default=4, help="busy processes a core (default 4)")
    parser.add_argument("--release", action="store_true", help="also run mha-course release under the load")
    options = parser.parse_args()

    cores = os.cpu_count() or 1
    ok = True
    print(f"{cores} cores, {options.per_core * cores} busy processes ({options.per_core} a core), "
          f"load average before: {os.getloadavg()[0]:.2f}")
    load = start_load(options.per_core * cores)
    try:
        time.sleep(2)  # the load average starts to show them
        grade = [sys.executable, "-m", "grader", "grade", "--solutions", "--seed", "0", "--json"]
        with RunnableSampler() as sampler:
            status, output, wall, cpu = timed(grade)
        print(f"grade --solutions --seed 0 --json: exit status {status}, wall {wall:.1f} s, CPU {cpu:.1f} s")
        ok &= report_grade(output)
        print(f"  {sampler.describe()}; load average {os.getloadavg()[0]:.2f}")
        if options.release:
            with tempfile.TemporaryDirectory(prefix="mha-release-") as folder, RunnableSampler() as sampler:
                release = [sys.executable, "-m", "grader", "release", str(Path(folder) / "edition")]
                status, _, wall, cpu = timed(release)
            print(f"release: exit status {status}, wall {wall:.1f} s, CPU {cpu:.1f} s")
            print(f"  {sampler.describe()}; load average {os.getloadavg()[0]:.2f}")
            ok &= status == 0
    finally:
        stop_load(load)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
