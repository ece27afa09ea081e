"""The test suite's wall time, and where it goes, file by file.

Run by hand: ``python bench/test_suite.py [pytest options]``, e.g. ``-n0``
for one process (the default is the project's, files side by side). Prints
the machine, the wall time of ``python -m pytest`` and, per test file, the
seconds its tests took (setup and teardown included, summed over the
processes), largest first: what to look at when the suite grows.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from grade_course import machine

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    print(machine())
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "junit.xml"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", f"--junitxml={report}", *sys.argv[1:]],
                              cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - started
        per_file: collections.Counter[str] = collections.Counter()
        tests = 0
        for case in ElementTree.parse(report).iter("testcase"):
            per_file[case.get("classname", "").split(".")[-1] or "?"] += float(case.get("time", 0))
            tests += 1
    lines = done.stdout.strip().splitlines()
    for line in lines[:-1]:
        if line.startswith(("FAILED", "ERROR")):
            print(line)
    print(lines[-1] if lines else done.stderr[-2000:])
    print(f"wall time {wall / 60:.1f} min ({wall:.0f} s), {tests} tests; test time summed "
          f"{sum(per_file.values()):.0f} s")
    for name, seconds in per_file.most_common():
        print(f"  {name:40s} {seconds:7.1f} s")
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
