"""``mha-course watch``: a table at once, a new one after each save, and
Ctrl-C leaves nothing running."""

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from grader.catalog import COURSE_ROOT, find_chapter
from grader.known_bugs import KNOWN_BUGS, apply_bug
from grader.watching import SETTLE, SETTLE_EMPTY, next_save, signature, watch

CH01 = find_chapter("ch01")
SOLUTION = CH01.solution().read_text(encoding="utf-8")
NO_SCALE = next(bug for bug in KNOWN_BUGS["ch01"] if bug.name == "no-scale")


class Watcher:
    """``mha-course watch`` in a process group of its own, its stdout read line by line."""

    def __init__(self, *args: str, cwd, env: dict[str, str] | None = None):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "grader", "watch", *args], cwd=cwd, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def report(self, timeout: float = 120) -> str:
        """The next report, up to and including its "Total:" line."""
        deadline, lines = time.monotonic() + timeout, []
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no report within {timeout} s; so far: {''.join(lines)}")
            lines.append(line)
            if line.startswith("Total:"):
                return "".join(lines)

    def interrupt(self) -> tuple[int, str]:
        os.killpg(self.process.pid, signal.SIGINT)
        self.process.wait(timeout=60)
        return self.process.returncode, self.process.stderr.read()


@pytest.fixture
def watcher(tmp_path):
    started = []

    def start(*args: str) -> Watcher:
        started.append(Watcher(*args, cwd=tmp_path))
        return started[-1]

    yield start
    for running in started:
        if running.process.poll() is None:
            os.killpg(running.process.pid, signal.SIGKILL)


def _save(path, text: str) -> None:
    # As an editor does: a new file put in place, so that the size or the time surely changes.
    staged = path.with_suffix(".swp")
    staged.write_text(text, encoding="utf-8")
    os.replace(staged, path)


def test_a_save_of_a_wrong_then_a_right_version_gives_two_new_reports(tmp_path, watcher):
    shutil.copy(CH01.stub(), tmp_path)
    target = tmp_path / CH01.file_name
    running = watcher("ch01", "--dir", ".", "--seed", "3")
    first = running.report()
    assert "not implemented yet" in first and "Total: 0 / 11 points" in first

    _save(target, apply_bug(SOLUTION, NO_SCALE))
    wrong = running.report()
    # scaled_dot_product_attention fails, and self_attention, which uses it: 2 + 1 + 2 points left.
    assert "✗ fail" in wrong and "Total: 5 / 11 points" in wrong, wrong
    # The hint in the rows of both (self_attention inherits it), not again under a check.
    assert wrong.count(NO_SCALE.hint) == 2 and "hint:" not in wrong, wrong

    _save(target, SOLUTION)
    right = running.report()
    assert "Total: 11 / 11 points" in right and "✗" not in right, right

    code, err = running.interrupt()
    assert code == 130 and err.strip() == "interrupted", err
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the watcher's forks went with it
        try:
            os.killpg(running.process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("processes of the watcher are still running")


def test_a_file_that_breaks_is_reported_and_watching_goes_on(tmp_path, watcher):
    target = tmp_path / CH01.file_name
    target.write_text(SOLUTION, encoding="utf-8")
    running = watcher(str(target.name), "--seed", "3")
    assert "Total: 11 / 11 points" in running.report()
    _save(target, SOLUTION.replace("def softmax(", "def softmax(:", 1))  # a syntax error
    broken = running.report()
    assert "Total: 11 / 11" not in broken and "syntax" in broken.lower(), broken
    _save(target, SOLUTION)
    assert "Total: 11 / 11 points" in running.report()
    assert running.interrupt()[0] == 130


def test_an_unknown_chapter_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "grader", "watch", "ch99"], capture_output=True, text=True,
                          cwd=COURSE_ROOT, timeout=60)
    assert done.returncode == 2 and "unknown chapter 'ch99'" in done.stderr and not done.stdout


# -- the polling itself, without a grade --------------------------------------------------


def test_the_watch_regrades_once_at_start_and_once_a_save(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("1", encoding="utf-8")
    graded = []

    def regrade():
        graded.append(path.read_text(encoding="utf-8"))
        if len(graded) < 3:  # the next save, made while this grade runs
            path.write_text("1" * (len(graded) + 1), encoding="utf-8")

    watch(lambda: [path], regrade, rounds=3)
    assert graded == ["1", "11", "111"]


def test_a_save_is_graded_only_once_the_file_has_settled(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("a", encoding="utf-8")
    last = signature([path])
    writes = iter(["ab", "abc", None, None])  # written twice in a row, then left alone

    def sleep(_seconds):
        text = next(writes)
        if text is not None:
            path.write_text(text, encoding="utf-8")

    assert next_save([path], last, sleep) == signature([path])
    assert path.read_text(encoding="utf-8") == "abc"


def test_a_file_emptied_to_be_written_is_waited_for_longer(tmp_path):
    """An editor truncates, then writes: on a busy machine the write may come
    more than SETTLE after, and the empty file must not be graded then."""
    path = tmp_path / "a.py"
    path.write_text("a", encoding="utf-8")
    last = signature([path])
    waits = []

    def sleep(seconds):
        waits.append(seconds)
        if len(waits) == 1:
            path.write_text("", encoding="utf-8")  # truncated ...
        elif seconds > SETTLE and len(waits) == 2:
            path.write_text("ab", encoding="utf-8")  # ... and written, after more than SETTLE

    assert next_save([path], last, sleep) == signature([path])
    assert path.read_text(encoding="utf-8") == "ab"
    assert SETTLE_EMPTY in waits


def test_a_missing_file_has_a_signature_and_its_appearance_is_a_save(tmp_path):
    path = tmp_path / "later.ipynb"
    assert signature([path]) == (None,)
    last = signature([path])
    calls = []

    def sleep(_seconds):
        calls.append(1)
        if len(calls) == 2:
            path.write_text("{}", encoding="utf-8")

    assert next_save([path], last, sleep)[0] is not None
