"""Whole-course grade of the reference solutions against a bare torch import.

Run by hand: ``python bench/grade_course.py [--runs N] [--chapters]
[--baseline DIR] [--device cuda]``. With ``--chapters``, each chapter's own grade (``grade
chNN --solutions``, a student's loop) is timed too. With ``--baseline``, the
whole-course grade of another checkout (``git worktree add DIR REV``) is
timed beside this one's, and each run's ratio of the two is printed: the way
to tell whether a change made grading slower. The commands are run
alternately, each run starting with the next one, so a machine that slows
down or speeds up during the benchmark affects them alike; the figures are
medians of wall time, and of CPU time (the command's and all its
processes'), which a busy machine disturbs less.

A second reference is timed beside the bare import: ``import torch`` with
the modules that the chapters' correct code imports on its own
(``Exercise.preload``: chapter 8's optimizer imports ``torch._dynamo``,
which costs about as much as torch itself). A grade of such a chapter
cannot end before that import has, whatever the grader does, so its
ratio is the floor of that chapter's grade and of the whole course's; the
last line says how far above it each stands.

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

REPOSITORY = Path(__file__).resolve().parent.parent
GRADE = [sys.executable, "-m", "grader", "grade", "--solutions", "--seed", "0"]
IMPORT = "python -c 'import torch'"
WHOLE = "mha-course grade --solutions"
BASELINE = "the baseline's grade --solutions"


def preloading() -> dict[str, tuple[str, ...]]:
    """The chapters whose correct code imports modules on its own, at a
    cost (``Exercise.preload``), and those modules."""
    from grader.catalog import CHAPTERS

    return {chapter.id: names for chapter in CHAPTERS
            if (names := tuple(dict.fromkeys(name for exercise in chapter.exercises for name in exercise.preload)))}


PRELOADED = ", ".join(dict.fromkeys(name for names in preloading().values() for name in names))
FLOOR = f"python -c 'import torch, {PRELOADED}'"


def machine() -> str:
    """One line on where the figures come from."""
    import torch

    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}")


def timed(command: list[str], folder: Path) -> tuple[float, float]:
    """Wall time and CPU time (user and system, of every process it waited for) of one run."""
    before, started = os.times(), time.perf_counter()
    subprocess.run(command, cwd=folder, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall, after = time.perf_counter() - started, os.times()
    return wall, (after.children_user + after.children_system) - (before.children_user + before.children_system)


def time_alternately(commands: dict[str, tuple[list[str], Path]], runs: int,
                     ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each command's wall and CPU times over ``runs`` runs (``commands``:
    name -> (argv, folder to run it from)), each run starting with the next
    command, so that none is always first."""
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    for run in range(runs):
        for name in names[run % len(names):] + names[:run % len(names)]:
            wall, cpu = timed(*commands[name])
            walls[name].append(wall)
            cpus[name].append(cpu)
    return walls, cpus


def print_ratios(walls: dict[str, list[float]], cpus: dict[str, list[float]]) -> None:
    """Each command's median wall and CPU time, and its wall time's ratio to the bare torch import's;
    with a baseline, the median of the runs' ratios of this grade to the baseline's."""
    base = statistics.median(walls[IMPORT])
    for name, values in walls.items():
        median = statistics.median(values)
        print(f"{name:40s} median {median:5.2f} s  (min {min(values):.2f}, max {max(values):.2f})"
              f"  ratio {median / base:4.2f}  CPU {statistics.median(cpus[name]):5.2f} s")
    floor = statistics.median(walls[FLOOR])
    bound = [WHOLE, *(f"mha-course grade {chapter} --solutions" for chapter in preloading())]
    above = ", ".join(f"{'whole course' if name == WHOLE else name.split()[2]} "
                      f"{statistics.median(walls[name]) / floor:.2f}" for name in bound if name in walls)
    print(f"floor of a grade of {', '.join(preloading())}: their correct code imports {PRELOADED} "
          f"(ratio {floor / base:4.2f}); each such grade over it: {above}")
    if BASELINE in walls:
        for what, times in (("wall", walls), ("CPU", cpus)):
            ratios = [ours / theirs for ours, theirs in zip(times[WHOLE], times[BASELINE])]
            print(f"{what} time of this grade over the baseline's, run by run: median {statistics.median(ratios):.3f}"
                  f" (min {min(ratios):.3f}, max {max(ratios):.3f})")


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
    process = subprocess.Popen(command, cwd=REPOSITORY, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    parser.add_argument("--baseline", type=Path, help="a checkout of another commit, to time its grade beside this one")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the checks run")
    options = parser.parse_args()
    grade = [*GRADE, "--device", options.device]
    commands = {IMPORT: ([sys.executable, "-c", "import torch"], REPOSITORY),
                FLOOR: ([sys.executable, "-c", f"import torch, {PRELOADED}"], REPOSITORY),
                WHOLE: (grade, REPOSITORY)}
    if options.baseline is not None:
        if not (options.baseline / "grader" / "__main__.py").is_file():
            parser.error(f"{options.baseline} is not a checkout of the course")
        commands[BASELINE] = (grade, options.baseline.resolve())  # run from there, its grader is the one imported
    if options.chapters:
        from grader.catalog import CHAPTERS

        for chapter in CHAPTERS:
            commands[f"mha-course grade {chapter.id} --solutions"] = (
                [sys.executable, "-m", "grader", "grade", chapter.id, "--solutions", "--seed", "0",
                 "--device", options.device], REPOSITORY)
    print(machine())
    print_ratios(*time_alternately(commands, options.runs))
    largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"largest single process (peak RSS): {largest:.0f} MiB")
    if Path("/proc/self/smaps_rollup").exists():
        peak, most = peak_tree_pss(grade)
        print(f"whole grade, all its processes (peak summed PSS): {peak / 2**20:.0f} MiB, "
              f"up to {most} processes at once")


if __name__ == "__main__":
    main()
