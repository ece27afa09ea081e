"""Time limits count the worker's CPU time, as the kernel counts it: a busy
machine fails no correct code, a worker that sleeps meets the clock's
backstop, and a timeout names the line the worker was on. (That an infinite
loop still fails within its limit is test_faults'.)"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time

import nbformat
import pytest

from conftest import CH01, FAST, SOLUTION, replace_function, result_of, statuses
from grader import forkserver, sandbox
from grader.grading import grade
from grader.isolation import Limits
from grader.loading import load_submission
from grader.notebooks import EXERCISE

pytestmark = pytest.mark.skipif(not sandbox.CPU_CLOCK, reason="the system tells no other process's CPU time")


def looping_self_attention(*lines: str) -> str:
    """Chapter 1 whose self_attention runs ``lines``, then loops forever."""
    body = "\n".join(f"    {line}" for line in (*lines, "while True:", "    pass"))
    return replace_function(SOLUTION, "self_attention",
                            f"def self_attention(x, w_q, w_k, w_v, mask=None):\n{body}\n")


def line_of(source: str, text: str) -> int:
    """The number of the last line of ``source`` that is ``text``, indented or not."""
    return max(number for number, line in enumerate(source.splitlines(), 1) if line.strip() == text)


def self_attention_message(report) -> str:
    assert statuses(report)["self_attention"] == "failed"
    checks = result_of(report, "self_attention").failed_checks
    assert all(check.kind == "timeout" for check in checks)
    return checks[0].message


# -- a machine busier than it has cores, emulated ----------------------------------------


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/task/{task}/children") as children:
                found.update(map(int, children.read().split()))
    return found


def _workers() -> set[int]:
    """The processes below this one's children: the workers its grades start
    (its children are fork servers, and the workers theirs)."""
    level = set().union(*map(_children, _children(os.getpid())))
    found = set(level)
    while level:
        level = set().union(*map(_children, level)) - found
        found |= level
    return found


def _cpu_seconds(pids: set[int]) -> float:
    """The CPU time the main threads of ``pids`` have used (the scheduler's count, in ns)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/schedstat") as stat:
            total += int(stat.read().split()[0])
    return total / 1e9


def _signal_all(pids: set[int], number: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, number)


@contextlib.contextmanager
def starved(run: float, stop: float):
    """The workers of the grades in this block are stopped (SIGSTOP) for
    ``stop`` seconds after each ``run`` seconds of CPU time they use, as on a
    machine far busier than it has cores. Metered on their CPU time rather
    than the clock, so that the wall time they take is at least
    ``stop / run`` times their CPU time however busy the machine running the
    test is, and costs no CPU."""
    done = threading.Event()

    def throttle() -> None:
        while not done.is_set():
            stopped: set[int] = set()
            ends = time.monotonic() + stop
            while not done.is_set() and time.monotonic() < ends:  # new workers are stopped at once
                new = _workers() - stopped
                _signal_all(new, signal.SIGSTOP)
                stopped |= new
                time.sleep(0.005)
            before = _cpu_seconds(stopped)
            _signal_all(stopped, signal.SIGCONT)
            ends = time.monotonic() + 10 * run  # one waiting for the grader uses none
            while not done.is_set() and time.monotonic() < ends and _cpu_seconds(stopped) - before < run:
                time.sleep(0.001)

    thread = threading.Thread(target=throttle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        _signal_all(_workers(), signal.SIGCONT)


# -- CPU time decides ---------------------------------------------------------------------

# softmax as the reference, but its first call in a worker computes for 0.15 s of CPU time.
SLOW_START = replace_function(SOLUTION, "softmax", '''
_computed = []


def softmax(x, dim=-1):
    import time

    if not _computed:
        started = time.process_time()
        while time.process_time() - started < 0.15:
            pass
        _computed.append(True)
    exps = torch.exp(x - x.amax(dim=dim, keepdim=True).detach())
    return exps / exps.sum(dim=dim, keepdim=True)
''')


def test_correct_code_starved_of_cpu_passes_though_its_wall_time_is_over_the_limit(grade_source):
    limits = Limits(check_seconds=1.0, exercise_seconds=4.0)
    started = time.monotonic()
    with starved(run=0.01, stop=0.15):  # that call: 0.15 s of CPU time, over 2 s by the clock
        report = grade_source(SLOW_START, limits=limits, only={"softmax"})
    elapsed = time.monotonic() - started
    assert statuses(report) == {"softmax": "passed"}, result_of(report, "softmax").failed_checks
    assert elapsed > 2 * limits.check_seconds


def test_a_worker_asleep_is_stopped_by_the_clocks_backstop(grade_source):
    limits = Limits(check_seconds=0.5, exercise_seconds=2.0)
    source = replace_function(SOLUTION, "self_attention", '''
def self_attention(x, w_q, w_k, w_v, mask=None):
    import time

    time.sleep(1000)
''')
    started = time.monotonic()
    report = grade_source(source, limits=limits, only={"self_attention"})
    elapsed = time.monotonic() - started
    message = self_attention_message(report)
    assert re.search(r"did not finish within 5 s, using \d+\.\d s of CPU time, "
                     rf"at line {line_of(source, 'time.sleep(1000)')} \(time\.sleep\(1000\)\): "
                     r"is it asleep, or waiting for something\?", message), message
    assert limits.check_wall_seconds < elapsed < limits.check_wall_seconds + 5


def test_without_a_cpu_figure_the_limits_are_wall_time(grade_source, monkeypatch):
    """As on macOS, which has no /proc."""
    monkeypatch.setattr(sandbox, "CPU_CLOCK", False)
    source = looping_self_attention()
    report = grade_source(source, only={"self_attention"})
    message = self_attention_message(report)
    assert re.search(rf"did not finish within 2 s, at line ({line_of(source, 'while True:')} \(while True:\)|"
                     rf"{line_of(source, 'pass')} \(pass\)): an infinite loop\?", message), message


def test_a_preloaded_copy_is_given_time_for_its_imports(tmp_path, monkeypatch):
    """The fork server answers within ANSWER_SECONDS, but a preloaded copy
    first imports, which takes many times longer on a loaded machine."""
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(2)\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(forkserver, "ANSWER_SECONDS", 0.5)
    server = sandbox.fork_server({CH01.id: load_submission(CH01.solution(), CH01.module)})
    try:
        copy = server.preloaded_copy(["slow_to_import"])
        try:
            sandbox.Worker(copy, CH01.id, FAST).kill()  # its first answer waits for the import
            sandbox.Worker(copy, CH01.id, FAST).kill()
        finally:
            copy.close()
    finally:
        server.close()


def test_a_clean_parent_is_given_time_for_its_preload(tmp_path, monkeypatch):
    """It answers a connection at once, but forks a fork server only once
    its preload is imported, which on a loaded machine takes far longer."""
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(2)\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(forkserver, "ANSWER_SECONDS", 0.5)
    with forkserver.clean_parent(["slow_to_import"]):
        server = sandbox.fork_server({CH01.id: load_submission(CH01.solution(), CH01.module)})
        try:
            sandbox.Worker(server, CH01.id, FAST).kill()
        finally:
            server.close()


# -- the line it was on -------------------------------------------------------------------
# Whichever limit stops the loop: on a machine with more than ten runnable
# processes a core, the clock's backstop comes before the CPU limit.


def test_a_timeout_names_the_line_in_a_file(grade_source):
    source = replace_function(SOLUTION, "self_attention", '''
def spin():
    while True:
        pass


def self_attention(x, w_q, w_k, w_v, mask=None):
    return spin()
''')
    report = grade_source(source, only={"self_attention"})
    message = self_attention_message(report)
    # The innermost line of the file, in the helper the exercise called.
    assert re.search(rf", at line ({line_of(source, 'while True:')} \(while True:\)|"
                     rf"{line_of(source, 'pass')} \(pass\)): an infinite loop", message), message


def test_a_timeout_names_the_line_in_a_notebook_cell(tmp_path):
    notebook = nbformat.read(CH01.notebook(), as_version=4)
    index = next(i for i, cell in enumerate(notebook.cells)
                 if EXERCISE in cell.metadata.get("tags", ())
                 and cell.metadata["mha_course"]["exercise"] == "self_attention")
    notebook.cells[index].source = "def self_attention(x, w_q, w_k, w_v, mask=None):\n    while True:\n        pass\n"
    path = tmp_path / f"{CH01.module}.ipynb"
    nbformat.write(notebook, path)
    report = grade([(CH01, path)], limits=FAST, seed=3, only={"self_attention"})
    message = self_attention_message(report)
    cell = sum(c.cell_type == "code" for c in notebook.cells[: index + 1])
    assert re.search(rf", at code cell {cell} \(self_attention\), line (2 \(while True:\)|3 \(pass\)): "
                     "an infinite loop", message), message


@pytest.mark.usefixtures("unscanned")
@pytest.mark.parametrize("line", ["faulthandler.unregister(signal.SIGUSR1)",
                                  "signal.signal(signal.SIGUSR1, signal.SIG_IGN)"],
                         ids=["unregistered", "ignored"])
def test_a_worker_that_turned_the_report_off_gets_the_message_without_a_line(grade_source, line):
    started = time.monotonic()
    report = grade_source(looping_self_attention("import faulthandler, signal", line), only={"self_attention"})
    elapsed = time.monotonic() - started
    message = self_attention_message(report)
    assert "of CPU time" in message and "an infinite loop" in message and ", at " not in message, message
    assert elapsed < FAST.check_seconds + 4  # the report is waited for a moment only


# -- what the worker writes is read as untrusted ---------------------------------------


def stack(filename: str, *frames: tuple[str, int]) -> bytes:
    lines = [f'  File "{name}", line {number} in f' for name, number in frames]
    return ("Current thread 0x00007f0000000000 (most recent call first):\n" + "\n".join(lines) + "\n").encode()


def test_the_stack_reader_takes_the_requests_thread_and_skips_junk():
    reader = sandbox.StackReader("/course/ch01.py")
    reader.feed(b"\xff\xfe junk \x00 not a frame\n" + b"x" * 100_000)  # an endless line is dropped
    reader.feed(b"\n" + stack("/course/ch01.py", ("/course/ch01.py", 7), ("/usr/lib/threading.py", 1)))
    assert reader.line == 7 and not reader.done  # a student's thread: a fallback only
    reader.feed(b"\n" + stack("/course/ch01.py", ("/other.py", 3), ("/course/ch01.py", 12),
                              ("/course/ch01.py", 40), (sandbox.worker.__file__, 200)))
    assert reader.done and reader.line == 12
    reader.feed(stack("/course/ch01.py", ("/course/ch01.py", 99), (sandbox.worker.__file__, 1)))
    assert reader.line == 12  # read no further


def test_the_stack_reader_matches_a_name_as_faulthandler_escapes_it():
    reader = sandbox.StackReader("/home/zoë/ch01.py")
    reader.feed(stack("", ("/home/zo\\xeb/ch01.py", 5), (sandbox.worker.__file__, 1)))
    assert reader.line == 5


def test_a_line_the_file_does_not_have_is_left_out_of_the_message(tmp_path):
    path = tmp_path / CH01.file_name
    path.write_text(SOLUTION, encoding="utf-8")
    submission = load_submission(path, CH01.module)
    for line in (0, -3, len(SOLUTION.splitlines()) + 1, 10**9):
        death = sandbox.WorkerDied("timed out", line=line)
        assert sandbox.timeout_reason(death, "2 s", 20, 2.0, submission) == "used 2 s of CPU time without finishing"
