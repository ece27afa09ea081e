"""What the OS layer (``grader.isolation``) costs: per worker, and per whole-course grade.

Run by hand: ``python bench/isolation_cost.py [--runs N] [--workers N]``.

* **Confining one worker**: a process forked from this one (torch imported)
  applies the policy a grade gives its workers (Landlock, seccomp, rlimits)
  and reports how long that took; medians over ``--workers`` forks.
* **A worker's first answer**: fork server, a worker that runs a small file
  and answers one call, with the layers and without (as on a machine that
  lacks them); medians.
* **A whole-course grade**: ``mha-course grade --solutions`` with the layers
  and without, and a bare ``import torch``, run alternately (so a machine
  that slows down affects all alike); medians of wall time and their ratio
  to the torch import.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from grade_course import REPOSITORY, print_ratios, time_alternately  # bench/, beside this file
from grader import isolation, sandbox, wire
from grader.loading import load_submission

WITHOUT_LAYERS = ("import sys, grader.sandbox as s; s.layers = frozenset; from grader.cli import run; "
                  "sys.argv = ['mha-course'] + sys.argv[1:]; run()")
COMMANDS = {
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "grade --solutions (OS layer)": [sys.executable, "-m", "grader", "grade", "--solutions", "--seed", "0"],
    "grade --solutions (no OS layer)": [sys.executable, "-c", WITHOUT_LAYERS, "grade", "--solutions",
                                        "--seed", "0"],
}


def confine_seconds(workers: int) -> list[float]:
    """How long ``isolation.confine`` takes in a freshly forked process."""
    folder = Path(tempfile.mkdtemp(prefix="mha-bench-"))
    policy = isolation.Policy(str(folder), sandbox._python_folders(), (), 0, None, sandbox.layers())
    policy = dataclasses.replace(policy, rules=isolation.fixed_rules(policy))
    found = []
    for _ in range(workers):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                started = time.perf_counter()
                isolation.confine(policy, isolation.Limits(), 0)
                os.write(write_fd, f"{time.perf_counter() - started:.9f}".encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as pipe:
            found.append(float(pipe.read()))
        os.waitpid(pid, 0)
    return found


def first_answer_seconds(workers: int, with_layers: bool) -> list[float]:
    """Fork a worker that runs a small file, and get one answer from it."""
    folder = Path(tempfile.mkdtemp(prefix="mha-bench-"))
    path = folder / "ch01_self_attention.py"
    path.write_text("import torch\n\ndef double(x):\n    return 2 * x\n", encoding="utf-8")
    submission = load_submission(path, "ch01_self_attention")
    original = sandbox.layers
    sandbox.layers = original if with_layers else frozenset
    try:
        server = sandbox.fork_server({"ch01": submission})
    finally:
        sandbox.layers = original
    request = {"function": "double", "args": wire.encode([torch.ones(3)]), "kwargs": {}, "device": "cpu"}
    found = []
    try:
        for _ in range(workers):
            started = time.perf_counter()
            worker = sandbox.probe(server, "ch01", sandbox.Limits()).worker
            worker.request(request, worker.deadline(10, 100))
            found.append(time.perf_counter() - started)
            worker.kill()
    finally:
        server.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=40)
    options = parser.parse_args()
    print(f"layers on this machine: {', '.join(sorted(sandbox.layers())) or 'none'}")
    confine = statistics.median(confine_seconds(options.workers))
    print(f"confining one worker: median {confine * 1e3:.2f} ms")
    on = statistics.median(first_answer_seconds(options.workers, True))
    off = statistics.median(first_answer_seconds(options.workers, False))
    print(f"a worker's first answer: {on * 1e3:.1f} ms with the OS layer, {off * 1e3:.1f} ms without "
          f"(+{(on - off) * 1e3:.1f} ms)")
    print_ratios(*time_alternately({name: (command, REPOSITORY) for name, command in COMMANDS.items()},
                                   options.runs))


if __name__ == "__main__":
    main()
