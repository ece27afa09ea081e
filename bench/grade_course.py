"""Whole-course grade of the reference solutions against a bare torch import.

Run by hand: ``python bench/grade_course.py [--runs N] [--chapters]``. With
``--chapters``, each chapter's own grade (``grade chNN --solutions``, a
student's loop) is timed too. The commands are run alternately, so a
machine that slows down or speeds up during the benchmark affects them
alike; the figures are medians of wall time.

Memory is measured in one more, untimed, run: a grade is several processes
(the grader, its copies grading chapters side by side, fork servers,
workers) that share most of their pages, so besides the largest single
process the figure to read is the peak of their summed proportional set
size (PSS: each shared page counted once, split between its sharers),
sampled from /proc every 20 ms (Linux only).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = {
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "mha-course grade --solutions": [sys.executable, "-m", "grader", "grade", "--solutions", "--seed", "0"],
}


def machine() -> str:
    """One line on where the figures come from."""
    import torch

    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}")


def wall_time(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def print_ratios(times: dict[str, list[float]]) -> None:
    """Each command's median wall time, and its ratio to the bare torch import's."""
    base = statistics.median(times["python -c 'import torch'"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:40s} median {median:5.2f} s  (min {min(values):.2f}, max {max(values):.2f})"
              f"  ratio {median / base:4.2f}")


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it, from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # ended meanwhile
            continue
        pid, ppid = int(text.split(" ", 1)[0]), int(text.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, []))
    return tree


def pss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_tree_pss(command: list[str]) -> tuple[int, int]:
    """Peak summed PSS of the command's process tree, and the most processes seen at once."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak, most = 0, 0
    while process.poll() is None:
        tree = process_tree(process.pid)
        peak = max(peak, sum(pss_bytes(pid) for pid in tree))
        most = max(most, len(tree))
        time.sleep(0.02)
    return peak, most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--chapters", action="store_true", help="time each chapter's grade too")
    options = parser.parse_args()
    commands = dict(COMMANDS)
    if options.chapters:
        from grader.catalog import CHAPTERS

        for chapter in CHAPTERS:
            commands[f"mha-course grade {chapter.id} --solutions"] = [
                sys.executable, "-m", "grader", "grade", chapter.id, "--solutions", "--seed", "0"]
    print(machine())
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(options.runs):
        for name, command in commands.items():
            times[name].append(wall_time(command))
    print_ratios(times)
    largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"largest single process (peak RSS): {largest:.0f} MiB")
    if Path("/proc/self/smaps_rollup").exists():
        peak, most = peak_tree_pss(COMMANDS["mha-course grade --solutions"])
        print(f"whole grade, all its processes (peak summed PSS): {peak / 2**20:.0f} MiB, "
              f"up to {most} processes at once")


if __name__ == "__main__":
    main()
