"""Per-exercise overhead: grading one exercise against running what its checks compute.

Run by hand: ``python bench/exercise_overhead.py [--runs N] [--chapter ch01]``.
For each exercise of the reference solutions this grades that exercise alone
(``grade(only=...)``, in this process, as ``mha-course grade`` does after its
imports) and records every call its checks send to a worker. It then makes
the same calls on the reference module directly, in this process: the
computation itself, with no worker, no pytest and no comparison. The
difference is what grading adds; the figures are medians of wall time.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch

from grader import remote_submission
from grader.catalog import CHAPTERS, find_chapter
from grader.grading import grade
from grader.module_calls import run_module_call


def recorded_calls(chapter, exercise: str) -> tuple[float, list[tuple]]:
    """Grade one exercise; its wall time and the calls its checks made."""
    calls: list[tuple] = []
    original = remote_submission.RemoteSubmission.call

    def record(self, function, args, kwargs, grad=None, module=None, portability=False, largest=False):
        calls.append((function, args, kwargs, grad, module))
        return original(self, function, args, kwargs, grad, module, portability, largest)

    remote_submission.RemoteSubmission.call = record
    try:
        started = time.perf_counter()
        report = grade([(chapter, chapter.solution())], seed=0,
                       only={exercise})
        seconds = time.perf_counter() - started
    finally:
        remote_submission.RemoteSubmission.call = original
    if not report.passed:
        raise SystemExit(f"the reference fails {chapter.id} {exercise}: the benchmark needs a clean pass")
    return seconds, calls


def direct_seconds(reference, calls: list[tuple]) -> float:
    """The same calls on the reference module, in this process."""
    started = time.perf_counter()
    for function, args, kwargs, grad, module in calls:
        args = list(args)
        if grad:
            for index in grad["wrt"]:
                args[index] = args[index].detach().requires_grad_(True)
        try:
            if module is None:
                result = getattr(reference, function)(*args, **kwargs)
            else:
                result = run_module_call(reference, function, module, args, kwargs, "cpu")
        except Exception:  # some checks call with bad arguments and expect an error
            continue
        if grad:
            output = result[grad["output"]] if grad.get("output") is not None else result
            (output * grad["grad_output"]).sum().backward()
    return time.perf_counter() - started


def load_reference(chapter):
    path = chapter.solution()
    spec = importlib.util.spec_from_file_location(f"bench_{chapter.module}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chapter", help="one chapter (default: all)")
    arguments = parser.parse_args()
    chapters = [find_chapter(arguments.chapter)] if arguments.chapter else CHAPTERS
    torch.set_num_threads(1)  # as in the workers
    print(f"{'exercise':38s} {'calls':>5s} {'graded':>9s} {'direct':>9s} {'overhead':>9s} {'per call':>9s}")
    totals = [0.0, 0.0, 0]
    rows: list[tuple[int, float]] = []  # (calls, graded seconds) of each exercise
    for chapter in chapters:
        reference = load_reference(chapter)
        for exercise in chapter.exercises:
            graded, direct, calls = [], [], []
            for _ in range(arguments.runs):
                seconds, calls = recorded_calls(chapter, exercise.name)
                graded.append(seconds)
                direct.append(direct_seconds(reference, calls))
            g, d = statistics.median(graded), statistics.median(direct)
            totals[0] += g
            totals[1] += d
            totals[2] += len(calls)
            rows.append((len(calls), g))
            print(f"{chapter.id + ' ' + exercise.name:38s} {len(calls):5d} {g * 1000:7.1f}ms {d * 1000:7.2f}ms "
                  f"{(g - d) * 1000:7.1f}ms {(g - d) / max(len(calls), 1) * 1000:7.2f}ms")
    graded, direct, calls = totals
    print(f"{'all, one exercise at a time':38s} {calls:5d} {graded:8.2f}s {direct * 1000:7.1f}ms "
          f"{graded - direct:8.2f}s {(graded - direct) / max(calls, 1) * 1000:7.2f}ms")
    if len(rows) > 2:
        # Graded time as a fixed cost per grade (the checks' fixtures, a fork
        # server, the worker that loads the file) plus a cost per call.
        slope, intercept = statistics.linear_regression([c for c, _ in rows], [g for _, g in rows])
        print(f"least-squares fit: {intercept * 1000:.1f} ms per grade + {slope * 1000:.2f} ms per call")


if __name__ == "__main__":
    main()
