"""One submission graded as the hosted platforms grade it, on one core.

Run by hand: ``python bench/hosted.py [--chapter ch01 ...]``.

PrairieLearn gives a grading container 0.9 of a core; Gradescope half a
vCPU by default. Pinned to one core (``taskset -c 0``), this times:

- a PrairieLearn job of each chapter's question: the entry point that
  ``mha-course prairielearn`` writes, run on a folder laid out like
  ``/grade`` with the chapter's reference solution uploaded;
- a Gradescope run of the whole course: ``run_autograder`` from the bundle
  ``mha-course gradescope`` writes, every chapter's reference submitted;

each against ``python -c 'import torch'`` on the same core, which every job
pays once. Wall and CPU seconds (the CPU of every process the job started,
all of them waited for); the score, which must be full marks. Neither
container is started: their start is the platform's (see the README's
table of paths).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from grader.catalog import CHAPTERS, find_chapter
from grader.gradescope import write_bundle
from grader.prairielearn import write_course

ONE_CORE = ["taskset", "-c", "0"]


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of ``command`` pinned to one core."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([*ONE_CORE, *command], env={**os.environ, **(env or {})}, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def prairielearn_job(course: Path, root: Path, chapter) -> tuple[float, float, float]:
    """``(wall, cpu, score)`` of a job of ``chapter``'s question."""
    shutil.copytree(course / "serverFilesCourse", root / "serverFilesCourse")
    (root / "student").mkdir()
    shutil.copy(chapter.solution(), root / "student" / chapter.file_name)
    wall, cpu = timed(["bash", str(root / "serverFilesCourse" / "mha-course" / "run"), "--chapters", chapter.id],
                      {"MHA_COURSE_GRADE_ROOT": str(root), "MHA_COURSE_PYTHON": sys.executable})
    return wall, cpu, json.loads((root / "results" / "results.json").read_text())["score"]


def gradescope_run(work: Path) -> tuple[float, float, str]:
    """``(wall, cpu, "score / max")`` of the whole course's run_autograder."""
    write_bundle(work / "autograder.zip")
    root = work / "autograder"
    with zipfile.ZipFile(work / "autograder.zip") as bundle:
        bundle.extractall(root / "source")
    (root / "submission").mkdir()
    (root / "results").mkdir()
    for chapter in CHAPTERS:
        shutil.copy(chapter.solution(), root / "submission" / chapter.file_name)
    wall, cpu = timed(["bash", str(root / "source" / "run_autograder")],
                      {"AUTOGRADER_ROOT": str(root), "MHA_COURSE_PYTHON": sys.executable,
                       "MHA_COURSE_VENV": str(root / "no-venv")})
    results = json.loads((root / "results" / "results.json").read_text())
    return wall, cpu, f"{results['score']} / {results['max_score']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapter", "-c", action="append", help="a chapter's question to time (default: all)")
    args = parser.parse_args()
    chapters = [find_chapter(name) for name in args.chapter] if args.chapter else list(CHAPTERS)
    work = Path(tempfile.mkdtemp(prefix="mha-bench-hosted-"))
    try:
        torch_wall, _ = timed([sys.executable, "-c", "import torch"])
        print(f"import torch on one core: {torch_wall:.2f} s")
        write_course(work / "prairielearn", chapters)
        for chapter in chapters:
            wall, cpu, score = prairielearn_job(work / "prairielearn", work / f"grade-{chapter.id}", chapter)
            print(f"PrairieLearn job {chapter.id}: {wall:.2f} s wall ({wall / torch_wall:.2f}x the import), "
                  f"{cpu:.2f} s CPU, score {score:g}")
        wall, cpu, score = gradescope_run(work)
        print(f"Gradescope, the whole course: {wall:.2f} s wall ({wall / torch_wall:.2f}x the import), "
              f"{cpu:.2f} s CPU, score {score}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
