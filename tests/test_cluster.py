"""``mha-course batch --cluster``: a class graded on a Dask cluster's workers
gets the CSV and results of a local batch, a killed worker loses no student,
and what cannot go on says so in one line.

The cluster is real and local: a scheduler and three worker processes of one
thread each, started as processes of their own on loopback, so that this
process never holds Dask's threads (it forks, and other test files follow it
in this process). Only the ``mha-course`` processes the tests start are the
cluster's clients.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed")
import psutil  # noqa: E402 - distributed's own dependency

from grader import cluster  # noqa: E402
from grader.class_folder import Unusable, list_entries, submission_targets  # noqa: E402
from grader.catalog import COURSE_ROOT  # noqa: E402
from test_batch import CH01, NB, PY, SOLUTION, STUB, notebook, read_csv, with_bug, write, zip_of  # noqa: E402
from test_batch import make_class as make_big_class  # noqa: E402

SEED = 5
WORKERS = 3
WORKER_HOOK = Path(__file__).with_name("cluster_worker.py")


def make_class(root: Path) -> Path:
    """Eight students of chapter 1, one of each kind of entry and outcome."""
    write(root / "ada" / PY, SOLUTION)                                    # a folder: full marks
    write(root / "ben" / PY, STUB)                                        # the untouched stub
    write(root / "cy_ch01.py", with_bug("no-scale"))                      # a loose file with a known bug
    write(root / "dan" / PY, SOLUTION.replace("def softmax(", "def softmax(:", 1))  # a syntax error in one
    write(root / "tia_ch01.ipynb", '{"cells": [')                         # a corrupt notebook
    zip_of(root / "ivy.zip", {f"ivy/{PY}": SOLUTION, "__MACOSX/ivy/._x": b"\0"})  # a zip
    write(root / "max" / PY, STUB, age=60)                                # the notebook saved after the stub
    write(root / "max" / NB, notebook(SOLUTION))
    write(root / "zed" / "notes.txt", "nothing to grade")                  # a reason naming what is there
    return root


def mha_course(*args: str, patch: str = "", env: dict | None = None, timeout: float = 240,
               ) -> subprocess.CompletedProcess:
    """``mha-course ARGS``, after the Python statements ``patch`` (in its process)."""
    program = f"import sys\n{patch}\nsys.argv[0] = 'mha-course'\nfrom grader.cli import run\nrun()\n"
    return subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, cwd=COURSE_ROOT,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200", **(env or {})})


def start(command: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as stream:
        return subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT, cwd=COURSE_ROOT,
                                start_new_session=True)  # a group of its own, stopped whole


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """The scheduler file of a local cluster of ``WORKERS`` worker processes
    (``cluster_worker.py`` preloaded), and the process of their nannies."""
    folder = tmp_path_factory.mktemp("cluster")
    address = folder / "scheduler.json"
    dask = [sys.executable, "-m", "dask"]
    local = ["--host", "127.0.0.1", "--no-dashboard"]
    processes = [start([*dask, "scheduler", "--scheduler-file", str(address), "--port", "0", *local],
                       folder / "scheduler.log")]
    try:
        processes.append(start([*dask, "worker", "--scheduler-file", str(address), "--nworkers", str(WORKERS),
                                "--nthreads", "1", "--preload", str(WORKER_HOOK), *local,
                                "--local-directory", str(folder / "workers")],  # not /tmp: they are killed
                               folder / "workers.log"))
        deadline = time.monotonic() + 120
        while (folder / "workers.log").read_text(errors="replace").count("Registered to") < WORKERS:
            assert time.monotonic() < deadline, (folder / "workers.log").read_text(errors="replace")
            assert all(process.poll() is None for process in processes), (folder / "workers.log").read_text()
            time.sleep(0.2)
        yield address, processes[1]
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def without_timings(value):
    if isinstance(value, dict):
        return {key: without_timings(item) for key, item in value.items() if key != "execution_time"}
    if isinstance(value, list):
        return [without_timings(item) for item in value]
    return value


def results(out: Path) -> dict[str, dict]:
    return {path.name: without_timings(json.loads(path.read_text(encoding="utf-8")))
            for path in sorted((out / "results").iterdir())}


def grading_worker(nannies: subprocess.Popen) -> psutil.Process | None:
    """A worker process whose grading service is grading now (it has forked
    the student's grading process beside its clean parent)."""
    for worker in psutil.Process(nannies.pid).children():
        with contextlib.suppress(psutil.Error):
            for service in worker.children():
                if len(service.children()) > 1:
                    return worker
    return None


@pytest.mark.timeout(400)
def test_a_class_graded_on_the_cluster_gets_the_local_csv_though_a_worker_is_killed(scheduler, tmp_path):
    """The slowest test of the file (a local batch, then the cluster's, whose
    services start cold): 20 to 30 s on two cores."""
    address, nannies = scheduler
    submissions = make_class(tmp_path / "class")
    local = mha_course("batch", str(submissions), "-c", "ch01", "--seed", str(SEED), "--jobs", "2",
                       "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stdout + local.stderr

    out = tmp_path / "on-cluster"
    command = [sys.executable, "-m", "grader", "batch", str(submissions), "-c", "ch01", "--seed", str(SEED),
               "--cluster", str(address), "--out", str(out)]
    batch = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=COURSE_ROOT,
                             env={**os.environ, "COLUMNS": "200"})
    killed = None
    try:
        while batch.poll() is None and killed is None:  # a worker dies mid-grade once the first student is done
            if (out / "results").is_dir() and any((out / "results").iterdir()):
                killed = grading_worker(nannies)
                if killed is not None:
                    killed.send_signal(signal.SIGKILL)
            time.sleep(0.05)
        stdout, stderr = batch.communicate(timeout=300)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert batch.returncode == 0, stdout + stderr
    assert killed is not None, "no worker was grading once the first student was done"
    assert (out / "grades.csv").read_bytes() == (tmp_path / "local" / "grades.csv").read_bytes()
    assert results(out) == results(tmp_path / "local")
    rows = read_csv(out / "grades.csv")
    assert (rows["ada"]["total"], rows["ivy"]["total"], rows["max"]["total"]) == (str(CH01.points),) * 3
    assert rows["dan"]["total"] == "3"  # softmax's syntax error costs what calls it; the NumPy ones pass
    assert "not valid notebook JSON" in rows["tia"]["note"]
    assert rows["zed"]["note"] == "no exercise file (expected names like ch01_self_attention.py or .ipynb); " \
                                  "found notes.txt"
    assert "8 graded, 0 unchanged" in stdout

    # Nothing changed: nothing graded again (the cluster is not even asked).
    kept = (out / "grades.csv").read_bytes(), (out / "batch-state.json").read_bytes()
    again = mha_course("batch", str(submissions), "-c", "ch01", "--seed", str(SEED), "--cluster", "tcp://127.0.0.1:9",
                       "--out", str(out))
    assert again.returncode == 0 and "0 graded, 8 unchanged" in again.stdout, again.stdout + again.stderr
    assert ((out / "grades.csv").read_bytes(), (out / "batch-state.json").read_bytes()) == kept

    # Unreachable: one line, and the grades of the earlier run are kept as they were.
    write(submissions / "eve" / PY, SOLUTION)
    done = mha_course("batch", str(submissions), "-c", "ch01", "--seed", str(SEED), "--cluster",
                      "tcp://127.0.0.1:9", "--out", str(out), env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"})
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stderr.strip().startswith("cluster error: cannot reach the Dask scheduler at tcp://127.0.0.1:9")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert ((out / "grades.csv").read_bytes(), (out / "batch-state.json").read_bytes()) == kept


def test_a_task_that_hangs_gets_its_row_and_the_batch_ends(scheduler, tmp_path):
    """``stuck``'s grading never ends (``cluster_worker.py``): past its limit
    (made 2 s and 1 s of margin here) its row says so, kept out of the
    state, and the others are graded."""
    address, _ = scheduler
    submissions = tmp_path / "class"
    write(submissions / "stuck" / PY, SOLUTION + "\n# the largest: graded first\n" * 50)
    write(submissions / "ada" / PY, SOLUTION)
    write(submissions / "bo" / PY, with_bug("no-scale"))
    out = tmp_path / "out"
    started = time.monotonic()
    done = mha_course("batch", str(submissions), "-c", "ch01", "--seed", str(SEED), "--cluster", str(address),
                      "--out", str(out), patch="import grader.batch as b, grader.cluster as c\n"
                      "b.student_seconds = lambda options: 2.0\nc.MARGIN_SECONDS = 1.0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 120
    rows = read_csv(out / "grades.csv")
    assert rows["stuck"]["note"] == "its grading did not end within 3 s on the cluster's worker and was " \
                                    "stopped; run the batch again"
    assert (rows["ada"]["total"], rows["bo"]["total"]) == (str(CH01.points), "5")
    state = json.loads((out / "batch-state.json").read_text(encoding="utf-8"))
    assert sorted(state["students"]) == ["ada", "bo"]  # stuck is graded again next run


def test_a_worker_of_another_version_of_the_course_is_refused(scheduler, tmp_path):
    """Here the client's fingerprint is made to differ, as a worker's would
    with other checks or solutions installed: no grade of it is written."""
    scheduler_file, _ = scheduler
    address = json.loads(scheduler_file.read_text(encoding="utf-8"))["address"]  # tcp://127.0.0.1:PORT
    submissions = tmp_path / "class"
    write(submissions / "ada" / PY, SOLUTION)
    out = tmp_path / "out"
    done = mha_course("batch", str(submissions), "-c", "ch01", "--cluster", address, "--out", str(out),
                      patch="import grader.batch as b\nb.grader_fingerprint = lambda: 'f' * 64")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "cluster error: the worker tcp://127.0.0.1:" in done.stderr
    assert "grades with other checks, known bugs or solutions than this course's (fingerprint " in done.stderr
    assert "here ffffffffffff): install this version of the course on every worker" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (out / "grades.csv").exists() and list((out / "results").iterdir()) == []


# -- no cluster needed ----------------------------------------------------------------


def test_jobs_has_no_meaning_with_a_cluster(tmp_path):
    write(tmp_path / "class" / "ada" / PY, SOLUTION)
    done = mha_course("batch", str(tmp_path / "class"), "--cluster", "tcp://127.0.0.1:9", "--jobs", "2")
    assert done.returncode == 2 and "--jobs has no meaning with --cluster" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_without_dask_the_error_says_what_to_install(tmp_path):
    write(tmp_path / "class" / "ada" / PY, SOLUTION)
    done = mha_course("batch", str(tmp_path / "class"), "--cluster", "tcp://127.0.0.1:9",
                      patch="import grader.cluster as c\nc.available = lambda: False")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == 'error: batch --cluster needs Dask\'s distributed: pip install -e ".[cluster]"'
    assert not (tmp_path / "class-grades").exists()


def test_a_local_batch_imports_no_dask(tmp_path):
    from test_startup import imported

    write(tmp_path / "class" / "ada_ch01.py", b"\xff\xfe")  # a row with a note: no check runs
    done, modules = imported(tmp_path, "batch", str(tmp_path / "class"), "--seed", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "grader.batch" in modules and not [name for name in modules if name.split(".")[0] in ("dask", "distributed")]


def test_every_entry_unpacked_from_its_parcel_is_found_as_the_original(tmp_path):
    """Files travel, not paths: each entry of test_batch's class of thirty
    (folders, zips, loose files, links, broken ones), packed and unpacked
    elsewhere, gives the same files to grade, named as the student named
    them, and the same reasons."""
    original = make_big_class(tmp_path / "class")
    for entry in list_entries(original):
        parcel = cluster.pack(entry)
        assert parcel.student == entry.student and parcel.digest == entry.digest
        copy = cluster.unpack(pickled(parcel), tmp_path / "worker" / entry.student)
        assert (copy.student, copy.digest, copy.size) == (entry.student, entry.digest, entry.size)
        assert [path.name for path in copy.paths] == [path.name for path in entry.paths]
        assert found(entry, tmp_path / "scratch-a" / entry.student) == found(copy, tmp_path / "scratch-b" / entry.student)


def test_a_folder_travels_without_what_is_not_graded(tmp_path):
    write(tmp_path / "ada" / PY, SOLUTION)
    write(tmp_path / "ada" / "data" / "weights.bin", b"\0" * 100_000)
    write(tmp_path / "ada" / ".git" / "objects" / "x.py", "print()")
    (entry,) = list_entries(tmp_path)
    parcel = cluster.pack(entry)
    assert {member.path: member.kind for member in parcel.members} == {"ada": "folder", "ada/data": "folder",
                                                                     f"ada/{PY}": "file"}
    assert parcel.bytes == len(SOLUTION.encode())


def test_a_parcel_larger_than_a_task_takes_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(cluster, "MAX_PARCEL_BYTES", 1000)
    write(tmp_path / "ada" / PY, SOLUTION)
    (entry,) = list_entries(tmp_path)
    with pytest.raises(cluster.TooLarge, match="MB a cluster.s task takes"):
        cluster.pack(entry)


def pickled(parcel):
    import pickle

    return pickle.loads(pickle.dumps(parcel))


def found(entry, scratch: Path):
    """What ``submission_targets`` makes of an entry: each chapter's file (its
    name as shown, its bytes) and why, or the reason it cannot be graded."""
    scratch.mkdir(parents=True)
    try:
        targets, what = submission_targets(entry.paths, scratch)
    except Unusable as error:
        return str(error)
    return what.sources(), [(chapter.id, path.read_bytes()) for chapter, path in targets], \
        sorted(line for line in what.ignored)
