"""Batch grading throughput: a class of generated submissions against a bare torch import.

Run by hand: ``python bench/batch_throughput.py [--students 50] [--runs N] [--jobs N]``.
Each student submits the whole course: a fifth the reference solutions, a
fifth the untouched stubs, a fifth the solved notebooks, two fifths the
solutions with one catalog bug in each chapter; every seventh student as a
zip. ``mha-course batch --force`` and ``python -c 'import torch'`` are run
alternately, so a machine that slows down or speeds up during the benchmark
affects both alike; the figures are medians of wall time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader.catalog import CHAPTERS, COURSE_ROOT
from grader.known_bugs import KNOWN_BUGS, apply_bug
from grader.notebooks import notebook_text


def make_class(folder: Path, students: int) -> None:
    """``students`` entries in ``folder``, one per student, as the module says."""
    for index in range(students):
        student = folder / f"student{index:03d}"
        student.mkdir(parents=True)
        for chapter in CHAPTERS:
            solution = chapter.solution().read_text(encoding="utf-8")
            kind = index % 5
            if kind == 0:
                files = {".py": solution}
            elif kind == 1:
                files = {".py": chapter.stub().read_text(encoding="utf-8")}
            elif kind == 2:
                files = {".ipynb": notebook_text(chapter, solution, COURSE_ROOT, "solutions")}
            else:  # a different bug for each student, in every chapter
                bugs = KNOWN_BUGS[chapter.id]
                files = {".py": apply_bug(solution, bugs[index % len(bugs)]) if bugs else solution}
            for suffix, text in files.items():
                (student / f"{chapter.module}{suffix}").write_text(text, encoding="utf-8")
        if index % 7 == 0:
            shutil.make_archive(str(student), "zip", folder, student.name)
            shutil.rmtree(student)


def wall_time(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=0, help="processes (default: one per core)")
    arguments = parser.parse_args()
    jobs = arguments.jobs or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="mha-bench-") as scratch:
        submissions, out = Path(scratch) / "submissions", Path(scratch) / "grades"
        make_class(submissions, arguments.students)
        commands = {
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
            "mha-course batch --force": [sys.executable, "-m", "grader", "batch", str(submissions),
                                         "--out", str(out), "--force", "--seed", "0", "--jobs", str(jobs)],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(arguments.runs):
            for name, command in commands.items():
                times[name].append(wall_time(command))
        # Again without --force: every submission is unchanged, none is graded.
        skip = wall_time([sys.executable, "-m", "grader", "batch", str(submissions), "--out", str(out)])
    torch_import = statistics.median(times["python -c 'import torch'"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:28s} median {median:6.2f} s  (min {min(values):.2f}, max {max(values):.2f})"
              f"  ratio {median / torch_import:5.2f}")
    batch = statistics.median(times["mha-course batch --force"])
    print(f"{arguments.students} students, whole course each, {jobs} jobs on {os.cpu_count()} cores: "
          f"{arguments.students / batch:.2f} submissions per second; one submission costs "
          f"{batch / arguments.students / torch_import:.2f} torch imports")
    print(f"re-run with nothing changed: {skip:.2f} s (ratio {skip / torch_import:.2f})")


if __name__ == "__main__":
    main()
