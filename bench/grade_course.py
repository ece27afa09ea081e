"""Whole-course grade of the reference solutions against a bare torch import.

Run by hand: ``python bench/grade_course.py [--runs N]``. The two commands are
run alternately, so a machine that slows down or speeds up during the
benchmark affects both alike; the figures are medians of wall time.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "mha-course grade --solutions": [sys.executable, "-m", "grader", "grade", "--solutions", "--seed", "0"],
}


def wall_time(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(runs):
        for name, command in COMMANDS.items():
            times[name].append(wall_time(command))
    base = statistics.median(times["python -c 'import torch'"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:32s} median {median:5.2f} s  (min {min(values):.2f}, max {max(values):.2f})"
              f"  ratio {median / base:4.2f}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"largest single process (peak RSS): {peak:.0f} MiB")


if __name__ == "__main__":
    main()
