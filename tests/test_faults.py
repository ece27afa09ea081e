"""Honest mistakes cost only the exercise they touch, with a message that says what happened."""

import resource

import pytest

from conftest import FAST, SOLUTION, STUB, replace_function, result_of, solution_source, statuses
from grader.catalog import find_chapter

OTHERS_PASS = {"softmax", "scaled_dot_product_attention", "softmax_numpy",
               "scaled_dot_product_attention_numpy"}


def self_attention_body(*lines: str) -> str:
    """A self_attention whose body is ``lines`` (nobody else calls it)."""
    body = "\n".join(f"    {line}" for line in lines)
    return f"def self_attention(x, w_q, w_k, w_v, mask=None):\n{body}\n"


def broken_self_attention(*lines: str) -> str:
    return replace_function(SOLUTION, "self_attention", self_attention_body(*lines))


def assert_only_self_attention_fails(report, *fragments: str) -> str:
    assert statuses(report) == {name: "passed" for name in OTHERS_PASS} | {"self_attention": "failed"}
    message = result_of(report, "self_attention").failed_checks[0].message
    for fragment in fragments:
        assert fragment in message
    return message


def test_reference_solution_passes(grade_source):
    report = grade_source(SOLUTION)
    assert report.passed and report.score == report.max_score == 11


def test_untouched_stub_is_not_implemented(grade_source):
    report = grade_source(STUB)
    assert report.score == 0
    assert set(statuses(report).values()) == {"not implemented"}
    assert {result.reason for result in report.exercises} == {"not implemented yet"}


def test_syntax_error_costs_only_its_function(grade_source):
    report = grade_source(broken_self_attention("return (x @ w_q.T"))
    message = assert_only_self_attention_fails(report, "syntax error", "line")
    assert "never closed" in message
    # Said once, by the row of the exercise it breaks, not again as a note on the file.
    assert result_of(report, "self_attention").reason.startswith(message)
    assert not any("syntax error" in note for note in report.notes.get("ch01", []))


def test_syntax_error_in_a_helper_is_named_by_its_callers(grade_source):
    source = replace_function(SOLUTION, "softmax", "def softmax(x, dim=-1):\n    return x.exp(\n")
    report = grade_source(source)
    assert statuses(report)["softmax"] == "failed"
    assert statuses(report)["scaled_dot_product_attention"] == "failed"
    caller = result_of(report, "scaled_dot_product_attention")
    assert "softmax has a syntax error at line" in caller.failed_checks[0].message
    assert "softmax" in caller.note
    assert statuses(report)["softmax_numpy"] == "passed"


CAUSAL = solution_source(find_chapter("ch04"))
# causal_mask that hides each token from itself; attend_with_cache that
# builds its own mask (correctly) but forgets the 1/sqrt(d).
SELF_BLIND = CAUSAL.replace("triu(\n        diagonal=num_keys - num_queries + 1", "triu(\n        diagonal=num_keys - num_queries")
OWN_MASK = SELF_BLIND.replace(
    "    mask = causal_mask(length, k.shape[-2], device=x_new.device)  # (T_new, T_past + T_new)\n"
    "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
    "    past = k.shape[-2] - length\n"
    "    mask = torch.ones(length, k.shape[-2], dtype=torch.bool, device=x_new.device).tril(past)\n"
    "    scores = q @ k.transpose(-2, -1)")


def test_the_note_names_a_failing_helper_only_where_the_check_ran_it(grade_source):
    assert SELF_BLIND != CAUSAL and OWN_MASK != SELF_BLIND
    report = grade_source(OWN_MASK, chapter="ch04")
    assert statuses(report) == {"causal_mask": "failed", "causal_self_attention": "failed",
                                "attend_with_cache": "failed"}
    assert result_of(report, "causal_self_attention").note == "it uses causal_mask, which fails too"
    assert result_of(report, "attend_with_cache").note == ""  # it never called causal_mask


def test_exception_at_import_is_a_note_not_a_failure(grade_source):
    source = SOLUTION + "\nprint(softmax(torch.ones(3)) + undefined_name)\n"
    report = grade_source(source)
    assert report.passed
    assert any("NameError" in note and "at import" in note for note in report.notes["ch01"])


def test_failing_decorator_leaves_only_its_function_undefined(grade_source):
    source = replace_function(SOLUTION, "self_attention",
                              "@no_such_decorator\n" + self_attention_body("return None"))
    report = grade_source(source)
    assert statuses(report)["self_attention"] == "missing"
    message = result_of(report, "self_attention").reason
    assert "self_attention is not defined" in message and "NameError" in message


def test_infinite_loop_times_out_within_the_limit(grade_source):
    before = _children_cpu_seconds()
    report = grade_source(broken_self_attention("while True:", "    pass"))
    spent = _children_cpu_seconds() - before
    assert_only_self_attention_fails(report, "used 2 s of CPU time without finishing", "infinite loop")
    # One check's limit for the loop, then the exercise's other checks are skipped: the
    # CPU time of every process the grade started (its fork server, and so its workers,
    # are reaped before it returns), which a loaded machine does not stretch as it does
    # wall time (8.7 s of it once, beside three other test runs on two cores).
    assert FAST.check_seconds <= spent < 2 * FAST.check_seconds
    checks = result_of(report, "self_attention").failed_checks
    assert all(check.kind == "timeout" for check in checks)


def test_slow_exercise_is_stopped_by_the_exercise_limit(grade_source):
    # Each call computes for just under the check limit: no check times out, the exercise does.
    report = grade_source(broken_self_attention(
        "import time", "started = time.process_time()",
        "while time.process_time() - started < 1.5:", "    pass", "return None"))
    assert_only_self_attention_fails(report)
    messages = [check.message for check in result_of(report, "self_attention").failed_checks]
    assert any("used up its time limit of 6 s" in m or "used the rest of the exercise's 6 s of CPU time" in m
               for m in messages)


@pytest.mark.usefixtures("unscanned")
@pytest.mark.parametrize("line, fragment", [
    ("import sys; sys.exit()", "called sys.exit(None)"),
    ("raise SystemExit(0)", "called sys.exit(0)"),
    ("import os; os._exit(0)", "ended the process (exit status 0)"),
    ("raise KeyboardInterrupt", "raised KeyboardInterrupt"),
    ("import ctypes; ctypes.string_at(0)", "segmentation fault"),
    ("import torch; torch.ones(64 * 2**30, dtype=torch.uint8)", "ran out of memory"),
    ("return [0] * 10**11", "ran out of memory"),
], ids=["sys.exit", "SystemExit", "os._exit", "KeyboardInterrupt", "segfault", "torch-oom", "list-oom"])
def test_process_level_faults_cost_only_their_exercise(grade_source, line, fragment):
    report = grade_source(broken_self_attention(line))
    assert_only_self_attention_fails(report, fragment)


@pytest.mark.usefixtures("unscanned")
def test_closing_the_pipe_and_running_on_costs_only_its_exercise(grade_source):
    # The worker's end of its pipe is closed, so the grader reads an end of
    # file while the process still runs: it is given a moment, then stopped.
    report = grade_source(broken_self_attention("import os; os.closerange(3, 4096)", "while True: pass"))
    assert_only_self_attention_fails(report, "closed its connection to the grader")


@pytest.mark.usefixtures("unscanned")
def test_the_graders_open_files_are_out_of_reach(grade_source, tmp_path):
    with open(tmp_path / "grades.csv", "w", encoding="utf-8") as grades:  # open in the grader
        fd = grades.fileno()
        report = grade_source(SOLUTION + f"\nimport os\nos.write({fd}, b'forged')\n")
    assert report.passed
    assert (tmp_path / "grades.csv").read_text(encoding="utf-8") == ""
    assert not any("forged" in note for note in report.notes.get("ch01", []))


@pytest.mark.usefixtures("unscanned")
@pytest.mark.parametrize("line, fragment", [
    ("import ctypes; ctypes.string_at(0)", "crashed with a segmentation fault"),
    ("hoard = [0] * 10**11", "MemoryError: ran out of memory"),
    ("raise KeyboardInterrupt", "at import: KeyboardInterrupt"),
    ("import os; os._exit(3)", "ended the process (exit status 3)"),
], ids=["segfault", "oom", "KeyboardInterrupt", "os._exit"])
def test_process_level_faults_at_import_are_skipped_with_a_note(grade_source, line, fragment):
    source = SOLUTION + "\n" + line + "\n"
    report = grade_source(source)
    assert report.passed
    number = len(source.splitlines())
    assert any(f"line {number}" in note and fragment in note and "went on without" in note
               for note in report.notes["ch01"]), report.notes


def test_exit_at_module_level_is_skipped(grade_source):
    report = grade_source(SOLUTION + "\nimport sys\nsys.exit(0)\n")
    assert report.passed
    assert any("sys.exit(0)" in note for note in report.notes["ch01"])


def test_hang_at_module_level_is_skipped(grade_source):
    report = grade_source(SOLUTION + "\nwhile True:\n    pass\n")
    assert report.passed
    assert any("of CPU time" in note and "went on without it" in note for note in report.notes["ch01"])


def test_print_flood_is_capped(grade_source, capfd):
    source = replace_function(SOLUTION, "softmax_numpy", '''
def softmax_numpy(x, axis=-1):
    for _ in range(20000):
        print("x" * 1000)
    shift = np.max(x, axis=axis, keepdims=True)
    exps = np.exp(x - shift)
    return exps / np.sum(exps, axis=axis, keepdims=True)
''')
    report = grade_source(source)
    assert report.passed
    assert "xxxx" not in capfd.readouterr().out


@pytest.mark.parametrize("line, fragment", [
    ("return None", "returned None"),
    ("return x", "returned tensor (5, 8) float32, expected a tuple (output, weights)"),
    ("return [1, 2]", "returned 2, expected a torch.Tensor"),
    ("return x, x", "has shape"),
    ("out, w = scaled_dot_product_attention(x @ w_q.T, x @ w_k.T, x @ w_v.T); "
     "return out, w.double()", "has dtype torch.float64, expected torch.float32"),
    ("return 'output', 'weights'", "returned the string 'weights', expected a torch.Tensor"),
    ("return torch.full(x.shape[:-1] + (w_v.shape[0],), float('nan')), "
     "torch.full(x.shape[:-1] + (x.shape[-2],), float('nan'))", "has NaN at"),
    ("out, w = scaled_dot_product_attention(x @ w_q.T, x @ w_k.T, x @ w_v.T); return out / 0, w",
     "has inf at"),
    ("out, w = scaled_dot_product_attention(x @ w_q.T, x @ w_k.T, x @ w_v.T); "
     "return out.to('meta'), w", "returned a tensor on meta for inputs on cpu"),
], ids=["none", "tensor", "list", "shape", "dtype", "strings", "nan", "inf", "meta-device"])
def test_wrong_results_say_what_is_wrong(grade_source, line, fragment):
    report = grade_source(broken_self_attention("import torch", line))
    assert_only_self_attention_fails(report, fragment)


def test_changing_an_input_in_place_fails(grade_source):
    source = replace_function(SOLUTION, "softmax", '''
def softmax(x, dim=-1):
    x -= x.amax(dim=dim, keepdim=True).detach()
    exps = torch.exp(x)
    return exps / exps.sum(dim=dim, keepdim=True)
''')
    report = grade_source(source)
    message = result_of(report, "softmax").failed_checks[0].message
    assert "changed its input x in place" in message


def test_deleted_function_is_missing(grade_source):
    source = replace_function(SOLUTION, "self_attention", "")
    report = grade_source(source)
    assert statuses(report)["self_attention"] == "missing"
    assert result_of(report, "self_attention").reason == "your file defines no function self_attention"


def test_unreadable_file_fails_every_exercise(grade_source):
    report = grade_source("x = 1\0\n")
    assert report.score == 0
    assert all("null bytes" in result.failed_checks[0].message for result in report.exercises)


def _children_cpu_seconds() -> float:
    """The CPU time of the reaped processes below this one so far (a process's
    counts once it and its own children are reaped)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime
