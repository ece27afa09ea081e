"""Submissions that try to turn failures into points get none.

Each starts from the untouched stub (worth 0) or from one wrong function,
adds a trick, and must still score what the honest code would.
"""

import json
import os

import pytest
from rich.console import Console

from conftest import SOLUTION, STUB, assert_fails_alone, replace_function, result_of, statuses
from grader.report import print_table, results_json

STUB_WITH = STUB + "\n"


# self_attention returns the values unweighted: wrong, and nothing calls it.
WRONG_SELF_ATTENTION = replace_function(SOLUTION, "self_attention", """
def self_attention(x, w_q, w_k, w_v, mask=None):
    v = x @ w_v.T
    weights = torch.full(x.shape[:-1] + x.shape[-2:-1], 1.0 / x.shape[-2])
    return weights @ v, weights
""")


@pytest.mark.parametrize("trick", [
    # Patching the comparisons: they run in the grader, not in this process.
    "import torch\ntorch.allclose = lambda *a, **k: True\n"
    "torch.testing.assert_close = lambda *a, **k: None\n",
    "import numpy\nnumpy.testing.assert_allclose = lambda *a, **k: None\n"
    "numpy.allclose = lambda *a, **k: True\n",
    "import pytest\npytest.fail = lambda *a, **k: None\n",
    # Pretending the run went well.
    'print("PASSED"); print(\'{"score": 11, "max_score": 11}\')\n',
    'with open("results.json", "w") as results:\n    results.write(\'{"score": 11, "tests": []}\')\n',
    'import pathlib\nfor folder in (pathlib.Path.cwd(), pathlib.Path.home()):\n'
    '    (pathlib.Path(folder) / "results.json").write_text(\'{"score": 11, "tests": []}\')\n',
    # The grader's own pytest, patched: the checks run in the grader, not in this process.
    "import _pytest.runner\n_pytest.runner.call_and_report = lambda *a, **k: None\n",
    # torch's internals, reached at import: no check has started there.
    "import torch._C as hidden\nhidden._set_torch_function_mode(None)\n",
    # Ending the run "cleanly".
    "import sys\nsys.exit(0)\n",
], ids=["torch-allclose", "numpy-testing", "pytest-fail", "fake-output", "results-json", "results-json-pathlib",
        "pytest-internals", "torch-internals", "sys-exit"])
def test_tricks_at_import_turn_no_failure_into_points(grade_source, trick, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a results.json would land, were it written from the grader's folder
    monkeypatch.setenv("HOME", str(tmp_path))
    report = grade_source(WRONG_SELF_ATTENTION + "\n" + trick)
    assert "max abs error" in assert_fails_alone(report, "self_attention")
    assert report.score == report.max_score - result_of(report, "self_attention").exercise.points
    # A worker writes in its own scratch folder (its working folder and its
    # HOME), removed after the grade: nothing lands beside the submission.
    assert not (tmp_path / "results.json").exists()


def test_exiting_at_import_is_skipped_with_a_note(grade_source):
    source = WRONG_SELF_ATTENTION + "\nimport os\nos._exit(0)\n"
    line = source.splitlines().index("os._exit(0)") + 1
    report = grade_source(source)
    assert "max abs error" in assert_fails_alone(report, "self_attention")
    assert report.score == report.max_score - result_of(report, "self_attention").exercise.points
    assert report.notes["ch01"] == [f"line {line} ended the process (exit status 0), e.g. with os._exit(); "
                                    "grading went on without it"]


def test_tricks_leave_an_untouched_stub_at_zero(grade_source):
    trick = ("import torch, numpy\ntorch.allclose = lambda *a, **k: True\n"
             "numpy.allclose = lambda *a, **k: True\nprint('PASSED')\nimport sys\nsys.exit(0)\n")
    report = grade_source(STUB_WITH + trick)
    assert report.score == 0
    assert set(statuses(report).values()) == {"not implemented"}


# torch 2.5 cannot make a tensor subclass under a dispatch mode (the worker's):
# there the lie fails before it is told.
SUBCLASS_NOT_MADE = "Creating a new Tensor subclass Liar"


@pytest.mark.parametrize("definition, fragment", [
    # An object equal to everything.
    ('''
class Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
def softmax(x, dim=-1):
    return Anything()
''', "returned a ch01_self_attention.Anything, expected a torch.Tensor"),
    # A tensor subclass that lies to torch's comparisons.
    ('''
class Liar(torch.Tensor):
    def __eq__(self, other): return True
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.isclose, torch.equal):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})
def softmax(x, dim=-1):
    return torch.zeros_like(x).as_subclass(Liar)
''', ("max abs error", SUBCLASS_NOT_MADE)),
], ids=["eq-always-true", "lying-tensor-subclass"])
def test_fake_results_do_not_pass(grade_source, definition, fragment):
    report = grade_source(replace_function(SOLUTION, "softmax", definition))
    message = assert_fails_alone(report, "softmax")
    assert any(reason in message for reason in ((fragment,) if isinstance(fragment, str) else fragment))


def test_exiting_from_a_function_costs_the_exercises_that_call_it(grade_source):
    # Exiting "successfully" from inside the function: the worker's exit status says how it ended.
    report = grade_source(replace_function(SOLUTION, "softmax", "def softmax(x, dim=-1):\n    import os\n"
                                                                "    os._exit(0)\n"))
    exited = "ended the process (exit status 0), e.g. with os._exit() (the exercise's other checks are skipped)"
    assert assert_fails_alone(report, "softmax").endswith(exited)
    for caller in ("scaled_dot_product_attention", "self_attention"):
        [first_check, *_] = result_of(report, caller).failed_checks
        assert first_check.kind == "exit" and first_check.message.endswith(exited)


def test_a_subclass_that_lies_is_judged_by_its_data(grade_source):
    source = replace_function(SOLUTION, "softmax", '''
class Liar(torch.Tensor):
    def __eq__(self, other): return True
def softmax(x, dim=-1):
    return torch.zeros_like(x).as_subclass(Liar)
''')
    message = assert_fails_alone(grade_source(source), "softmax")
    assert SUBCLASS_NOT_MADE in message or ("max abs error" in message and "got 0" in message)


@pytest.mark.parametrize("function, definition, refused", [
    ("softmax", "def softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n", "torch.softmax"),
    ("softmax", "def softmax(x, dim=-1):\n    return x.softmax(dim)\n", "torch.softmax"),
    ("softmax", "def softmax(x, dim=-1):\n    return torch.nn.functional.log_softmax(x, dim).exp()\n",
     "torch.nn.functional.log_softmax"),
    ("scaled_dot_product_attention", '''
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    import torch.nn.functional as F
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out, torch.zeros(q.shape[:-1] + k.shape[-2:-1])
''', "torch.nn.functional.scaled_dot_product_attention"),
], ids=["torch.softmax", "Tensor.softmax", "log_softmax", "F.sdpa"])
def test_calling_what_the_exercise_asks_for_is_refused(grade_source, function, definition, refused):
    report = grade_source(replace_function(SOLUTION, function, definition))
    message = assert_fails_alone(report, function)
    assert f") calls {refused}" in message
    assert message.endswith(", which this exercise asks you to write yourself")
    # The refusal names the call and its line: the source's note would say it again.
    assert result_of(report, function).note == ""


def test_a_forbidden_call_on_a_branch_no_check_takes_costs_nothing_and_is_noted(grade_source):
    definition = ("def softmax(x, dim=-1):\n    if x.dim() > 50:\n        return torch.softmax(x, dim)\n"
                  "    exps = torch.exp(x - x.amax(dim=dim, keepdim=True))\n"
                  "    return exps / exps.sum(dim=dim, keepdim=True)\n")
    source = replace_function(SOLUTION, "softmax", definition)
    line = source.splitlines().index(definition.splitlines()[2]) + 1
    report = grade_source(source)
    assert report.passed and report.score == report.max_score
    note = f"line {line} calls torch.softmax, which this exercise asks you to write yourself"
    assert result_of(report, "softmax").note == note
    assert {result.exercise.name for result in report.exercises if result.note} == {"softmax"}
    # Where a student reads it: the table's row, and the exercise's test in Gradescope's JSON.
    console = Console(record=True, width=200)
    print_table(report, console)
    assert f"note: {note}" in console.export_text()
    [test] = [test for test in results_json(report)["tests"] if test["name"].startswith("ch01 softmax:")]
    assert test["score"] == test["max_score"] and test["output"].endswith(f"\nnote: {note}")


OWN_SOFTMAX = ("    exps = torch.exp(x - x.amax(dim=dim, keepdim=True))\n"
               "    return exps / exps.sum(dim=dim, keepdim=True)\n")


@pytest.mark.parametrize("definition, written, called", [
    # Imported under another name, inside the function.
    ("def softmax(x, dim=-1):\n    from torch.nn.functional import softmax as smooth\n    if x.dim() > 50:\n"
     "        return smooth(x, dim)\n" + OWN_SOFTMAX, "return smooth(x, dim)", "torch.nn.functional.softmax"),
    # Through a helper of the file.
    ("def _normalise(x, dim):\n    import torch.nn.functional as F\n    return F.softmax(x, dim)\n\n"
     "def softmax(x, dim=-1):\n    if x.dim() > 50:\n        return _normalise(x, dim)\n" + OWN_SOFTMAX,
     "return F.softmax(x, dim)", "torch.nn.functional.softmax"),
    # Through an alias of the module, or a name spelled in pieces.
    ("def softmax(x, dim=-1):\n    T = torch\n    if x.dim() > 50:\n        return T.softmax(x, dim)\n" + OWN_SOFTMAX,
     "return T.softmax(x, dim)", "torch.softmax"),
    ("def softmax(x, dim=-1):\n    if x.dim() > 50:\n        return getattr(torch, \"soft\" + \"max\")(x, dim)\n"
     + OWN_SOFTMAX, "return getattr(torch", "torch.softmax"),
], ids=["renamed-import", "helper", "alias", "name-in-pieces"])
def test_the_note_finds_a_forbidden_call_through_imports_aliases_and_helpers(grade_source, definition, written,
                                                                             called):
    # On a branch no check's input takes: only reading the source finds it, and it costs nothing.
    source = replace_function(SOLUTION, "softmax", definition)
    report = grade_source(source)
    assert report.passed
    line = next(number for number, text in enumerate(source.splitlines(), start=1) if written in text)
    assert result_of(report, "softmax").note == (f"line {line} calls {called}, which this exercise asks you to "
                                                 "write yourself")


def test_a_call_hidden_from_the_source_is_refused_when_it_runs(grade_source):
    # A method name computed at run time, on a tensor: the scan cannot tell
    # what it reaches, the worker's dispatcher can.
    source = replace_function(SOLUTION, "softmax", '''
def softmax(x, dim=-1):
    name = "soft" + "max"
    return getattr(x, name)(dim)
''')
    message = assert_fails_alone(grade_source(source), "softmax")
    line = source.splitlines().index("    return getattr(x, name)(dim)") + 1
    assert message.startswith("softmax(x ")  # the call that ran, not a line of the source
    assert message.endswith(f"calls torch.softmax (its kernel aten::_softmax) at line {line} "
                            "(return getattr(x, name)(dim)), which this exercise asks you to write yourself")


def test_nn_multihead_attention_is_refused_in_chapter_3(grade_source):
    from conftest import solution_source
    from grader.catalog import find_chapter

    source = replace_function(solution_source(find_chapter("ch03")), "torch_multihead_forward", '''
def torch_multihead_forward(query, key, value, num_heads, in_proj_weight, in_proj_bias,
                            out_proj_weight, out_proj_bias, key_padding_mask=None, batch_first=False):
    module = nn.MultiheadAttention(query.shape[-1], num_heads, batch_first=batch_first)
    return module(query, key, value, key_padding_mask=key_padding_mask)[0]
''')
    report = grade_source(source, chapter="ch03")
    message = assert_fails_alone(report, "torch_multihead_forward", find_chapter("ch03"))
    assert ") calls torch.nn.MultiheadAttention" in message
    assert message.endswith(", which this exercise asks you to write yourself")


@pytest.mark.parametrize("fallback, passes", [
    ("        exps = torch.exp(x - x.amax(dim=dim, keepdim=True))\n"
     "        return exps / exps.sum(dim=dim, keepdim=True)\n", True),
    ("        return x\n", False),
], ids=["own-softmax", "wrong-value"])
def test_a_caught_refusal_is_judged_by_what_the_call_returns(grade_source, fallback, passes):
    # The refused call computed nothing: what comes back is the student's own
    # code's, right or wrong. The source still gets its note.
    definition = ("def softmax(x, dim=-1):\n    try:\n        return torch.softmax(x, dim)\n"
                  "    except RuntimeError:\n" + fallback)
    source = replace_function(SOLUTION, "softmax", definition)
    line = source.splitlines().index("        return torch.softmax(x, dim)") + 1
    report = grade_source(source)
    if passes:
        assert report.passed
    else:
        assert "max abs error" in assert_fails_alone(report, "softmax")
    assert result_of(report, "softmax").note == (f"line {line} calls torch.softmax, which this exercise asks "
                                                 "you to write yourself")


def test_other_exercises_may_use_torch_softmax(grade_source):
    source = SOLUTION.replace("weights = softmax(scores.masked_fill(no_keys, 0.0), dim=-1)",
                              "weights = torch.softmax(scores.masked_fill(no_keys, 0.0), dim=-1)")
    assert source != SOLUTION
    assert grade_source(source).passed


@pytest.mark.parametrize("name, text", [
    ("conftest.py", '''
import pytest
import torch
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
'''),
    ("pytest.ini", "[pytest]\naddopts = -p no:python\n"),
    ("pyproject.toml", "[tool.pytest.ini_options]\naddopts = '--co'\n"),
], ids=["conftest", "pytest.ini", "pyproject"])
def test_pytest_files_beside_the_submission_are_ignored(grade_source, tmp_path, name, text):
    (tmp_path / name).write_text(text)
    assert "max abs error" in assert_fails_alone(grade_source(WRONG_SELF_ATTENTION), "self_attention")
    report = grade_source(STUB)
    assert report.score == 0
    assert set(statuses(report).values()) == {"not implemented"}


@pytest.mark.parametrize("name, value", [
    ("PYTEST_ADDOPTS", "--co"),  # collect only: every check "passes" by never running
    ("PYTEST_ADDOPTS", "--junitxml=report.xml"),  # an option of the caller's own test run
    ("PYTEST_PLUGINS", "a_plugin_nobody_installed"),
    ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", ""),
], ids=["collect-only", "junitxml", "plugins", "autoload"])
def test_pytest_settings_in_the_environment_are_ignored_and_left_as_they_were(grade_source, monkeypatch,
                                                                               name, value):
    monkeypatch.setenv(name, value)
    assert "max abs error" in assert_fails_alone(grade_source(WRONG_SELF_ATTENTION), "self_attention")
    assert grade_source(SOLUTION).passed
    assert os.environ[name] == value


def test_json_mode_is_not_fooled_by_printing(tmp_path):
    """Whatever the submission prints, stdout holds the grader's JSON alone."""
    import subprocess
    import sys

    path = tmp_path / "ch01_self_attention.py"
    path.write_text(STUB + '\nprint(\'{"score": 11, "max_score": 11, "tests": []}\')\n')
    done = subprocess.run([sys.executable, "-m", "grader", "grade", str(path), "--json", "--seed", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert json.loads(done.stdout)["score"] == 0


def test_a_kernel_behind_a_forbidden_call_is_refused(grade_source):
    # softmin(-x) is softmax(x); neither reading the source nor the
    # torch-function check sees the softmax it calls inside: the dispatcher does.
    source = replace_function(SOLUTION, "softmax", """
def softmax(x, dim=-1):
    return torch.nn.functional.softmin(-x, dim)
""")
    message = assert_fails_alone(grade_source(source), "softmax")
    assert "calls torch.softmax (its kernel aten::_softmax) at line" in message
    assert message.endswith("(return torch.nn.functional.softmin(-x, dim)), which this exercise asks you to "
                            "write yourself")


@pytest.mark.parametrize("body", [
    "    with torch._C.DisableTorchFunction():\n        return torch.softmax(x, dim)\n",
    "    from torch.overrides import _pop_mode_temporarily\n    with _pop_mode_temporarily():\n"
    "        return torch.softmax(x, dim)\n",
    "    return torch.ops.aten._softmax(x, dim, False)\n",
    # The kernels by name, or the torch-function check disabled, spelled in pieces.
    '    kernels = getattr(getattr(torch, "op" + "s"), "at" + "en")\n'
    '    return getattr(kernels, "_soft" + "max")(x, dim, False)\n',
    '    internals = getattr(torch, "_" + "C")\n    with getattr(internals, "DisableTorch" + "Function")():\n'
    '        return getattr(torch, "log_soft" + "max")(x, dim).exp()\n',
    # Through an alias, or imported by name.
    "    T = torch\n    with T._C.DisableTorchFunction():\n        return T.softmax(x, dim)\n",
    '    import importlib\n    overrides = importlib.import_module("torch." + "overrides")\n'
    "    with overrides._pop_mode_temporarily():\n        return torch.softmax(x, dim)\n",
], ids=["DisableTorchFunction", "pop-mode", "torch.ops", "aten-by-name", "torch-function-disabled",
        "alias", "importlib"])
def test_torch_internals_do_not_reach_around_the_refusal(grade_source, body):
    # Nothing here is refused for being read: the forbidden op is, where it
    # runs (or the trick fails by itself: there is no mode left to pop).
    report = grade_source(replace_function(SOLUTION, "softmax", "def softmax(x, dim=-1):\n" + body))
    assert_fails_alone(report, "softmax")
    assert result_of(report, "softmax").failed_checks[0].kind in ("forbidden", "error")


def test_scaled_dot_product_attention_reached_around_the_check_is_refused(grade_source):
    definition = '''
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    functional = getattr(torch.nn, "function" + "al")
    with getattr(getattr(torch, "_" + "C"), "DisableTorch" + "Function")():
        out = getattr(functional, "scaled_dot_product_" + "attention")(q, k, v, attn_mask=mask, scale=scale)
    return out, torch.zeros(q.shape[:-1] + k.shape[-2:-1])
'''
    report = grade_source(replace_function(SOLUTION, "scaled_dot_product_attention", definition))
    assert_fails_alone(report, "scaled_dot_product_attention")
    assert result_of(report, "scaled_dot_product_attention").failed_checks[0].kind == "forbidden"


def test_an_object_that_pretends_to_be_a_tensor_is_judged_as_what_it_is(grade_source):
    source = replace_function(SOLUTION, "softmax", '''
class Pretender:
    shape = (7,)
    dtype = torch.float32
    @property
    def __class__(self):
        return torch.Tensor
    def __eq__(self, other):
        return True
def softmax(x, dim=-1):
    return Pretender()
''')
    message = assert_fails_alone(grade_source(source), "softmax")
    assert "softmax(x (7,), dim=-1) raised AttributeError" in message
