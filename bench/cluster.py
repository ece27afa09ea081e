"""Batch throughput on a Dask cluster against a local batch: ``batch --cluster`` and ``batch --jobs``.

Run by hand (it needs ``pip install -e ".[cluster]"``):
``python bench/cluster.py [--students 16] [--workers 1 2] [--chapter ch01 ...]``.

The class is ``bench/batch_throughput.py``'s (each student submits every
chapter graded: reference solutions, stubs, solved notebooks, one catalog
bug a chapter, every seventh a zip). For each N of ``--workers``, a local
cluster of N worker processes of one thread each (``dask scheduler`` and
``dask worker``, on loopback) grades it twice: cold (each worker starts its
grading service: torch, the chapters' imports, the checks' collection) and
warm (``--force`` again: the services are kept), and ``batch --jobs N``
grades it here, for comparison. Prints students per second for each, and
the ratio of N workers to the first N. Wall time of the whole command,
client included; the machine's other load counts too, so run it idle.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from batch_throughput import make_class, wall_time  # noqa: E402

from grader.catalog import CHAPTERS, find_chapter  # noqa: E402


@contextlib.contextmanager
def local_cluster(folder: Path, workers: int):
    """The scheduler file of a cluster of ``workers`` processes, one thread each, stopped at the end."""
    folder.mkdir()
    address = folder / "scheduler.json"
    dask, local = [sys.executable, "-m", "dask"], ["--host", "127.0.0.1", "--no-dashboard"]
    logs = [open(folder / name, "wb") for name in ("scheduler.log", "workers.log")]
    processes = [subprocess.Popen([*dask, "scheduler", "--scheduler-file", str(address), "--port", "0", *local],
                                  stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True)]
    try:
        processes.append(subprocess.Popen([*dask, "worker", "--scheduler-file", str(address), "--nworkers",
                                           str(workers), "--nthreads", "1", *local,
                                           "--local-directory", str(folder / "workers")],
                                          stdout=logs[1], stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 120
        while (folder / "workers.log").read_text(errors="replace").count("Registered to") < workers:
            if time.monotonic() > deadline or any(process.poll() is not None for process in processes):
                sys.exit(f"the cluster did not start: see {folder}")
            time.sleep(0.2)
        yield address
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for log in logs:
            log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--chapter", "-c", action="append", help="a chapter to grade (default: all)")
    arguments = parser.parse_args()
    chapters = [find_chapter(name) for name in arguments.chapter] if arguments.chapter else list(CHAPTERS)
    chosen = [option for chapter in chapters for option in ("-c", chapter.id)]
    rates: dict[str, dict[int, float]] = {"cluster, cold": {}, "cluster, warm": {}, "local --jobs N": {}}
    with tempfile.TemporaryDirectory(prefix="mha-bench-cluster-") as scratch:
        submissions = Path(scratch) / "submissions"
        make_class(submissions, arguments.students)
        for workers in arguments.workers:
            batch = [sys.executable, "-m", "grader", "batch", str(submissions), *chosen, "--seed", "0", "--force"]
            with local_cluster(Path(scratch) / f"cluster-{workers}", workers) as address:
                on_cluster = [*batch, "--cluster", str(address), "--out", str(Path(scratch) / f"grades-{workers}")]
                rates["cluster, cold"][workers] = arguments.students / wall_time(on_cluster)
                rates["cluster, warm"][workers] = arguments.students / wall_time(on_cluster)
            local = [*batch, "--jobs", str(workers), "--out", str(Path(scratch) / f"local-{workers}")]
            rates["local --jobs N"][workers] = arguments.students / wall_time(local)
    first = arguments.workers[0]
    print(f"{arguments.students} students, {', '.join(chapter.id for chapter in chapters)} each, "
          f"on {os.cpu_count()} cores; students per second (ratio to N={first}):")
    print(f"{'':16s}" + "".join(f"{f'N={workers}':>18s}" for workers in arguments.workers))
    for name, by_workers in rates.items():
        cells = "".join(f"{by_workers[workers]:8.2f} ({by_workers[workers] / by_workers[first]:4.2f}x)   "
                        for workers in arguments.workers)
        print(f"{name:16s}{cells}")


if __name__ == "__main__":
    main()
