"""The project's attack corpus: submissions that try to get points they did
not earn, or to reach what they are not graded on.

Each case hides its trick inside one exercise (its *target*) of an otherwise
correct chapter file. Wherever it runs, the target scores 0, every other
exercise and every other student keeps its points, the grade ends within its
bound, and nothing the trick started is left running.

A point comes only from data the grader judges, what the kernel measures or
refuses, and torch's dispatcher refusing a forbidden call in the worker: so
each case says which of those stops it (``Attack.stopped_by``). The
``unconfined`` tests take the kernel's layers away, as on a machine without
Landlock or seccomp, and show what is left: the grader's deadlines and its
reaping. The student edition and the Gradescope bundle run some of these
cases too (tests/test_release.py, tests/test_gradescope.py).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import grader.forkserver
import grader.isolation
import grader.sandbox
from conftest import DEVICE_OPTION, SOLUTION, STUB, affected_by, grading_in, replace_function, solution_source
from grader import reaping
from grader.batch import CSV_FILE, GradingOptions, run_batch
from grader.batch_state import STATE_FILE
from grader.catalog import COURSE_ROOT, find_chapter
from grader.grading import GradeReport

CH01, CH03, CH04 = find_chapter("ch01"), find_chapter("ch03"), find_chapter("ch04")
REFERENCE = CH01.solution()
# A whole chapter 1 grade with FAST limits, and room for a loaded machine: the limits
# are CPU time, which a busy machine hands out slowly (an unconfined fork flood
# spends its exercise's 6 s on forks: 15 s by the clock at load 8 on 2 cores).
BOUND_SECONDS = 60
# Where the "appends to the grader" attack writes: inside the grader's package
# (an editable install's), in a file whose existence would do no harm.
GRADER_PROBE = COURSE_ROOT / "grader" / "attack-probe.txt"


@dataclass(frozen=True)
class Attack:
    """A trick, written as the definition of the exercise it targets.

    ``stopped_by``: what must stop it. "refusal" - torch's dispatcher in the
    worker refuses the forbidden computation, on every route; "kernel" - the
    kernel's count of memory; "os" - the kernel's other layers (Landlock,
    seccomp, rlimits); "data" - the grader judges what came back, and it is
    wrong.
    """

    name: str
    chapter: str
    target: str
    definition: str
    stopped_by: str

    def source(self, base: str | None = None) -> str:
        return replace_function(base or solution_source(find_chapter(self.chapter)), self.target, self.definition)


SOFTMAX_BY_HAND = "    exps = torch.exp(x - x.amax(dim=dim, keepdim=True))\n    return exps / exps.sum(dim=dim, keepdim=True)\n"

# Chapter 7's whole (L, S) score matrix, hidden from every measure the worker makes.
NAIVE_TILED = '''
    scale = q.shape[-1] ** -0.5
    scores = q @ k.transpose(-2, -1) * scale  # (..., L, S)
    if causal:
        L, S = q.shape[-2], k.shape[-2]
        visible = torch.arange(S, device=q.device) <= torch.arange(L, device=q.device)[:, None] + S - L
        scores = scores.masked_fill(~visible, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True).clamp(min=-1e30)
    p = torch.exp(scores - m)
    l = p.sum(dim=-1, keepdim=True)
    return (p @ v) / l.clamp(min=1e-30), (m + torch.log(l)).squeeze(-1)
'''


def unwrapping_subclass(name: str) -> str:
    """Source of a tensor subclass ``name`` that holds a plain tensor and runs
    every op on the plain tensors, with every dispatch mode popped (where a
    mode-based guard or measure would be), wrapping the results again."""
    return '''
class NAME(torch.Tensor):
    @staticmethod
    def __new__(cls, inner):
        made = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)
        made.inner = inner
        return made
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._python_dispatch import _disable_current_modes
        plain = lambda value: value.inner if isinstance(value, NAME) else value
        with _disable_current_modes():
            out = func(*map(plain, args), **{key: plain(v) for key, v in (kwargs or {}).items()})
        return NAME(out) if isinstance(out, torch.Tensor) else out
'''.replace("NAME", name)


ATTACKS = [
    Attack("alias-hides-internals", "ch01", "softmax", '''
def softmax(x, dim=-1):
    T = torch
    with T._C.DisableTorchFunction():
        return T.softmax(x, dim)
''', "refusal"),
    Attack("importlib-pops-the-modes", "ch01", "softmax", '''
def softmax(x, dim=-1):
    import importlib
    dispatch = importlib.import_module("torch.utils." + "_python_dispatch")
    internals = importlib.import_module("torch." + "_C")
    with getattr(dispatch, "_disable_current_" + "modes")():
        with getattr(internals, "DisableTorch" + "Function")():
            return torch.softmax(x, dim)
''', "refusal"),
    # The standard library reached through torch's own attributes, every mode popped
    # and pushed back within the call.
    Attack("torch-sys-pops-and-restores-modes", "ch01", "softmax", '''
def softmax(x, dim=-1):
    dispatch = torch.sys.modules["torch.utils._python_dispatch"]
    popped = [dispatch._pop_mode() for _ in range(dispatch._len_torch_dispatch_stack())]
    try:
        return torch.ops.aten._softmax.default(x, dim, False)
    finally:
        for mode in reversed(popped):
            dispatch._push_mode(mode)
''', "refusal"),
    Attack("builtin-names-of-its-own", "ch01", "softmax", '''
def softmax(x, dim=-1):
    def exec(code):  # a function named like a builtin, then the builtin itself
        return code
    run = __builtins__["exec"] if isinstance(__builtins__, dict) else __builtins__.exec
    found = {"x": x, "dim": dim, "torch": torch}
    run(exec("out = torch.softmax(x, dim)"), found)
    return found["out"]
''', "refusal"),
    Attack("softmax-on-another-thread", "ch01", "softmax", '''
def softmax(x, dim=-1):
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(torch.softmax, x, dim).result()
''', "refusal"),
    Attack("tensor-subclass-unwraps", "ch01", "softmax", unwrapping_subclass("Unwrapping") + '''
def softmax(x, dim=-1):
    return Unwrapping(x).softmax(dim).inner
''', "refusal"),
    Attack("module-written-and-imported", "ch01", "softmax", '''
def softmax(x, dim=-1):
    import importlib, sys
    with open("helper_module.py", "w") as helper:
        helper.write("import torch\\ndef soft(x, dim):\\n    return torch.softmax(x, dim)\\n")
    sys.path.insert(0, ".")
    return importlib.import_module("helper_module").soft(x, dim)
''', "refusal"),
    Attack("refusals-replaced-at-import", "ch01", "softmax", '''
import sys as _sys
_refusals = _sys.modules["grader.refusals"]
_refusals.install = lambda forbidden: None
_refusals.REFUSED = "nothing refused"
def softmax(x, dim=-1):
    return torch.softmax(x, dim)
''', "refusal"),
    Attack("mha-forward-with-torch-functions-off", "ch03", "torch_multihead_forward", '''
def torch_multihead_forward(query, key, value, num_heads, in_proj_weight, in_proj_bias,
                            out_proj_weight, out_proj_bias, key_padding_mask=None, batch_first=False):
    q, k, v = (t.transpose(0, 1) if batch_first else t for t in (query, key, value))
    with torch._C.DisableTorchFunction():
        out = F.multi_head_attention_forward(
            q, k, v, q.shape[-1], num_heads, in_proj_weight, in_proj_bias, None, None, False, 0.0,
            out_proj_weight, out_proj_bias, training=False, key_padding_mask=key_padding_mask,
            need_weights=False)[0]
    return out.transpose(0, 1) if batch_first else out
''', "refusal"),
    Attack("portability-tracker-silenced", "ch04", "causal_mask", '''
def causal_mask(num_queries, num_keys=None, device=None):
    import sys
    sys.modules["grader." + "portability"].DeviceTracker.problem = lambda self, result: None
    num_keys = num_queries if num_keys is None else num_keys
    return torch.ones(num_queries, num_keys, dtype=torch.bool).tril(num_keys - num_queries)
''', "data"),
    Attack("numpy-exercise-uses-torch", "ch01", "softmax_numpy", '''
def softmax_numpy(x, axis=-1):
    return torch.softmax(torch.from_numpy(x), axis).numpy()
''', "refusal"),
    Attack("numpy-exercise-uses-torch-on-a-thread", "ch01", "softmax_numpy", '''
def softmax_numpy(x, axis=-1):
    import threading
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("value", torch.from_numpy(x).softmax(axis).numpy()))
    worker.start()
    worker.join()
    return out["value"]
''', "refusal"),
    # Chapter 7: the whole score matrix, with the worker's measure of it switched off or lied to.
    Attack("measure-popped", "ch07", "tiled_attention", '''
def tiled_attention(q, k, v, block_size, causal=False):
    from torch.utils._python_dispatch import _pop_mode
    try:
        _pop_mode()
    except Exception:
        pass
''' + NAIVE_TILED, "kernel"),
    Attack("measure-rewritten-through-gc", "ch07", "tiled_attention", '''
def tiled_attention(q, k, v, block_size, causal=False):
    import gc
    for found in gc.get_objects():
        if type(found).__name__ == "Measure":
            found.__class__.__torch_dispatch__ = lambda self, func, types, args=(), kwargs=None: func(
                *args, **(kwargs or {}))
''' + NAIVE_TILED, "kernel"),
    Attack("scores-in-a-subclass", "ch07", "tiled_attention", unwrapping_subclass("Hidden") + '''
def tiled_attention(q, k, v, block_size, causal=False):
    out, lse = _naive(Hidden(q), Hidden(k), Hidden(v), causal)
    return out.inner, lse.inner
def _naive(q, k, v, causal):
''' + NAIVE_TILED, "kernel"),
    Attack("scores-kept-in-shared-memory", "ch07", "tiled_attention", '''
def tiled_attention(q, k, v, block_size, causal=False):
    import math, mmap
    L, S = q.shape[-2], k.shape[-2]
    shape = (*q.shape[:-1], S)
    shared = mmap.mmap(-1, q.element_size() * math.prod(shape))  # a shared mapping: not private data
    scores = torch.frombuffer(shared, dtype=q.dtype).view(shape)
    torch.matmul(q, k.transpose(-2, -1), out=scores)
    scores.mul_(q.shape[-1] ** -0.5)
    if causal:
        visible = torch.arange(S) <= torch.arange(L)[:, None] + S - L
        scores.masked_fill_(~visible, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True).clamp(min=-1e30)
    scores.sub_(m).exp_()
    l = scores.sum(dim=-1, keepdim=True)
    return (scores @ v) / l.clamp(min=1e-30), (m + torch.log(l)).squeeze(-1)
''', "kernel"),
    Attack("memory-set-aside-at-import", "ch07", "tiled_attention", '''
_SPARE = torch.empty(64 * 2**20 // 4)  # set aside before any check, then let go
_SPARE.fill_(0.0)
del _SPARE
def tiled_attention(q, k, v, block_size, causal=False):
''' + NAIVE_TILED, "kernel"),
    Attack("execs-the-reference", "ch01", "self_attention", f'''
def self_attention(x, w_q, w_k, w_v, mask=None):
    namespace = {{}}
    with open({str(REFERENCE)!r}) as reference:
        exec(reference.read(), namespace)
    return namespace["self_attention"](x, w_q, w_k, w_v, mask)
''', "os"),
    Attack("appends-to-the-grader", "ch01", "self_attention", f'''
def self_attention(x, w_q, w_k, w_v, mask=None):
    with open({str(GRADER_PROBE)!r}, "a") as grader_file:
        grader_file.write("\\n# every later stub passes\\n")
    return x
''', "os"),
    Attack("forks-a-process", "ch01", "self_attention", '''
def self_attention(x, w_q, w_k, w_v, mask=None):
    import os, time
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
    return x
''', "os"),
    Attack("fork-flood", "ch01", "self_attention", '''
def self_attention(x, w_q, w_k, w_v, mask=None):
    import os, time
    for _ in range(40):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
    return x
''', "os"),
    Attack("stops-the-fork-server", "ch01", "self_attention", '''
def self_attention(x, w_q, w_k, w_v, mask=None):
    import os, signal
    os.kill(os.getppid(), signal.SIGSTOP)
    return x
''', "os"),
    Attack("runs-a-program", "ch01", "self_attention", '''
def self_attention(x, w_q, w_k, w_v, mask=None):
    import os
    os.execv("/bin/sh", ["sh", "-c", "sleep 30"])  # the worker would become a shell
''', "os"),
    Attack("raises-its-own-limits", "ch01", "self_attention", '''
def self_attention(x, w_q, w_k, w_v, mask=None):
    import resource
    resource.prlimit(0, resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    return x
''', "os"),
    Attack("writes-200-mib", "ch01", "self_attention", '''
def self_attention(x, w_q, w_k, w_v, mask=None):
    with open("hoard.bin", "wb") as hoard:
        for _ in range(200):
            hoard.write(b"x" * 2**20)
    return x
''', "os"),
]
BY_NAME = {attack.name: attack for attack in ATTACKS}


def others_keep_their_points(report, attack: Attack) -> None:
    """The target scores 0; every exercise of the chapter that does not
    build on it passes."""
    builds_on_it = affected_by(find_chapter(attack.chapter), attack.target)
    for result in report.exercises:
        if result.exercise.name == attack.target:
            assert result.score == 0, f"{attack.name}: {result.reason}"
        elif result.exercise.name not in builds_on_it:
            assert result.status == "passed", f"{attack.name} cost {result.exercise.name}: {result.reason}"


def json_keeps_the_others_points(tests: list[dict], attack: Attack) -> None:
    """``others_keep_their_points`` for a results.json's tests (the student
    edition's ``grade --json``, the Gradescope bundle)."""
    chapter = find_chapter(attack.chapter)
    builds_on_it = affected_by(chapter, attack.target)
    by_name = {test["name"].split(":")[0]: test for test in tests}
    for exercise in chapter.exercises:
        test = by_name[f"{chapter.id} {exercise.name}"]
        if exercise.name == attack.target:
            assert test["score"] == 0, f"{attack.name}: {test['output']}"
        elif exercise.name not in builds_on_it:
            assert test["score"] == test["max_score"], f"{attack.name} cost {exercise.name}: {test['output']}"


def nothing_left_running() -> None:
    assert reaping.descendants() == frozenset()


# What the kernel stops it stops only where it has the layers.
KERNEL_LAYERS = {"landlock", "scopes", "seccomp"} <= grader.sandbox.layers()
kernel_layers = pytest.mark.skipif(not KERNEL_LAYERS, reason="this kernel lacks Landlock's scopes "
                                   "(Linux 6.12) or the seccomp filter")


@pytest.fixture
def unconfined(monkeypatch):
    """Workers without the kernel's layers, as on a machine that lacks
    Landlock and seccomp: what is left must still end every grade."""
    monkeypatch.setattr(grader.sandbox, "layers", frozenset)
    monkeypatch.setattr(grader.forkserver, "ANSWER_SECONDS", 1.0)


def grade_attack(grade_source, attack: Attack, base: str | None = None):
    started = time.monotonic()
    report = grade_source(attack.source(base), chapter=attack.chapter)
    assert time.monotonic() - started < BOUND_SECONDS
    nothing_left_running()
    grader_untouched()
    return report


@pytest.fixture(scope="module")
def attack_report(tmp_path_factory):
    """``attack_report(attack)``: ``grade_attack``'s report on ``attack`` in a
    student's grade, each attack graded once for the module.

    Shared because the corpus's two tests of a student's grade asked for the
    same grade (the same file, seed, limits and device): one asserts that the
    target scores nothing and every other exercise keeps its points, the other
    what stopped it. Reading both from one grade asserts all of it, with half
    the grades. ``grade_attack``'s own assertions (the bound, nothing left
    running, the grader untouched) are made on the grade when it is made; one
    that fails them is not kept, so the next test that asks grades again and
    fails too. The grades without the kernel's layers (``unconfined``) are
    different grades, and keep their own."""
    folder = tmp_path_factory.mktemp("attacks")
    reports: dict[str, GradeReport] = {}

    def report_on(attack: Attack) -> GradeReport:
        if attack.name not in reports:
            reports[attack.name] = grade_attack(grading_in(folder / attack.name), attack)
        return reports[attack.name]

    return report_on


def grader_untouched() -> None:
    """No worker wrote into the grader's folder (on a kernel without
    Landlock one could: the probe is removed, and only there allowed)."""
    written = GRADER_PROBE.exists()
    GRADER_PROBE.unlink(missing_ok=True)
    assert not (written and KERNEL_LAYERS), "a worker wrote into the grader's folder"


# -- student's grade -----------------------------------------------------------------


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda attack: attack.name)
def test_every_attack_scores_nothing_on_its_target(attack_report, attack):
    """The target scores 0, every exercise that does not build on it passes,
    within the bound, with nothing left running and the grader untouched."""
    if attack.stopped_by == "kernel" and not grader.isolation.BUDGET_COUNTED:
        pytest.skip("the kernel counts a call's memory on Linux only")
    others_keep_their_points(attack_report(attack), attack)


@kernel_layers
@pytest.mark.parametrize("name, fragment", [
    ("execs-the-reference", "PermissionError"),
    ("appends-to-the-grader", "PermissionError"),
    ("forks-a-process", "PermissionError"),
    ("stops-the-fork-server", "PermissionError"),
    ("writes-200-mib", "File too large"),
    ("runs-a-program", "PermissionError"),
    ("raises-its-own-limits", "PermissionError"),
    ("alias-hides-internals", "calls torch.softmax (its kernel aten::_softmax) at line"),
    ("torch-sys-pops-and-restores-modes", "calls torch.softmax (its kernel aten::_softmax) at line"),
    ("softmax-on-another-thread", "calls torch.softmax (its kernel aten::_softmax)"),
    ("tensor-subclass-unwraps", "calls torch.softmax (its kernel aten::_softmax) at line"),
    ("refusals-replaced-at-import", "calls torch.softmax (its kernel aten::_softmax) at line"),
    ("mha-forward-with-torch-functions-off", "calls torch.nn.functional.multi_head_attention_forward at line"),
    ("numpy-exercise-uses-torch", "uses torch at line"),
    ("portability-tracker-silenced", "would return a tensor on the CPU when run on a GPU"),
    ("measure-popped", "needed more than 24 MiB at once"),
    ("measure-rewritten-through-gc", "needed more than 24 MiB at once"),
    ("scores-in-a-subclass", "needed more than 24 MiB at once"),
    ("scores-kept-in-shared-memory", "needed more than 24 MiB at once"),
    ("memory-set-aside-at-import", "needed more than 24 MiB at once"),
])
def test_what_stops_each_attack_is_named(attack_report, name, fragment):
    """One of the target's failed checks names what stopped the attack (read
    from the grade ``test_every_attack_scores_nothing_on_its_target`` made)."""
    attack = BY_NAME[name]
    report = attack_report(attack)
    target = next(result for result in report.exercises if result.exercise.name == attack.target)
    assert any(fragment in check.message for check in target.failed_checks), target.failed_checks[0].message


@pytest.mark.usefixtures("unconfined")
@pytest.mark.parametrize("name", ["forks-a-process", "fork-flood", "stops-the-fork-server"])
def test_without_the_kernels_layers_deadlines_and_reaping_end_the_grade(grade_source, name):
    """A machine without Landlock or seccomp: the processes a submission
    forks are killed when the grade ends, a stopped fork server is replaced."""
    attack = BY_NAME[name]
    report = grade_attack(grade_source, attack)
    # self_attention returns x: wrong, and nothing else is affected.
    others_keep_their_points(report, attack)


def test_forged_answers_earn_nothing_the_kernel_refuses(grade_source):
    """A worker that writes its own answer frames into the grader's pipe, with
    a made-up measurement, still has to compute the values, and chapter 7's
    whole score matrix does not fit the memory the kernel allows."""
    source = replace_function(solution_source(find_chapter("ch07")), "tiled_attention", '''
def tiled_attention(q, k, v, block_size, causal=False):
    import os, sys
    wire = sys.modules["grader.wire"]
    out, lse = _naive(q, k, v, causal)
    forged = {"ok": True, "value": wire.encode((out, lse)), "reached": [], "args": wire.encode([q, k, v]),
              "kwargs": {}, "footprint": {"largest": {"shape": [1, 16], "numel": 16},
                                          "reduction": {"op": "sum", "width": 2, "shape": [1, 2]}}}
    frame = wire.dump(forged)
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            if os.fstat(fd).st_mode & 0o170000 == 0o010000:  # a pipe: the answers' one among them
                os.write(fd, frame)
        except OSError:
            pass
    return out, lse
def _naive(q, k, v, causal):
''' + NAIVE_TILED)
    report = grade_source(source, chapter="ch07")
    tiled = next(result for result in report.exercises if result.exercise.name == "tiled_attention")
    assert tiled.score == 0
    nothing_left_running()


# -- a grade's outputs ------------------------------------------------------------


def test_a_file_python_cannot_parse_costs_that_chapter_alone(tmp_path):
    """A 20,000-term expression makes Python's parser give up: one line for
    that chapter, every other chapter's verdict kept, no traceback."""
    (tmp_path / CH01.file_name).write_text(SOLUTION, encoding="utf-8")
    deep = "x = " + " + ".join(["1"] * 20000) + "\n"
    (tmp_path / "ch02_cross_attention.py").write_text(deep, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "grader", "grade", "--dir", str(tmp_path), "--json",
                           "--seed", "1", "--timeout", "5", *DEVICE_OPTION],
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr
    results = json.loads(done.stdout)
    scores = {test["name"].split(":")[0]: test for test in results["tests"]}
    assert all(test["score"] == test["max_score"] for name, test in scores.items() if name.startswith("ch01"))
    ch02 = [test for name, test in scores.items() if name.startswith("ch02")]
    assert ch02 and all(test["score"] == 0 and "cannot be parsed: it is nested too deeply" in test["output"]
                        for test in ch02)


def test_a_piped_grade_ends_when_the_grader_does(tmp_path):
    """``grade --json | reader``: the reader sees the end of the output when
    the grader exits, and nothing the submission started writes after it."""
    out = tmp_path / "grade.json"
    path = tmp_path / CH01.file_name
    path.write_text(BY_NAME["forks-a-process"].source(), encoding="utf-8")
    started = time.monotonic()
    with open(out, "w", encoding="utf-8") as stream:
        done = subprocess.run([sys.executable, "-m", "grader", "grade", str(path), "--json", "--seed", "1",
                               "--timeout", "5", *DEVICE_OPTION], stdout=subprocess.PIPE, stderr=stream, timeout=120)
    assert time.monotonic() - started < BOUND_SECONDS
    assert json.loads(done.stdout)["score"] == CH01.points - CH01.exercise("self_attention").points


STDOUT_HOLDER = Attack("holds-the-graders-stdout", "ch01", "self_attention", '''
def self_attention(x, w_q, w_k, w_v, mask=None):
    import os, time
    def parent(pid):
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    grader = parent(parent(os.getpid()))  # the worker's fork server's parent
    if os.fork() == 0:
        try:
            with open(f"/proc/{grader}/fd/1", "w") as stdout:
                for _ in range(300):
                    stdout.write("forged\\n")
                    stdout.flush()
                    time.sleep(0.1)
        finally:
            os._exit(0)
    return x
''', "os")
# The command line without the kernel's layers.
UNCONFINED_CLI = ("import sys, grader.sandbox; grader.sandbox.layers = frozenset; "
                  "from grader.cli import run; sys.argv = ['mha-course'] + sys.argv[1:]; run()")


@pytest.mark.parametrize("confined", [True, False], ids=["confined", "unconfined"])
def test_a_process_that_holds_the_graders_output_dies_with_the_grade(tmp_path, confined):
    """The reader of ``grade --json``'s output sees its end when the grader
    exits: with the layers, the worker can neither fork nor reach the
    grader's output; without them, what it forked is killed before the
    report is written."""
    path = tmp_path / CH01.file_name
    path.write_text(STDOUT_HOLDER.source(), encoding="utf-8")
    prefix = [sys.executable, "-m", "grader"] if confined else [sys.executable, "-c", UNCONFINED_CLI]
    started = time.monotonic()
    done = subprocess.run([*prefix, "grade", str(path), "--json", "--seed", "1", "--timeout", "5",
                           *DEVICE_OPTION], capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < BOUND_SECONDS
    if confined:
        assert json.loads(done.stdout)["score"] == CH01.points - CH01.exercise("self_attention").points


# -- an instructor's batch -------------------------------------------------------------


BATCH_ATTACKS = ["execs-the-reference", "appends-to-the-grader", "forks-a-process", "fork-flood",
                 "stops-the-fork-server", "writes-200-mib"]


def classmate_reader(alice: Path) -> Attack:
    return Attack("reads-a-classmate", "ch01", "self_attention", f'''
def self_attention(x, w_q, w_k, w_v, mask=None):
    namespace = {{}}
    with open({str(alice)!r}) as classmate:
        exec(classmate.read(), namespace)
    return namespace["self_attention"](x, w_q, w_k, w_v, mask)
''', "os")


def daemon(out: Path) -> Attack:
    """A process that would outlive the grade and rewrite its outputs."""
    forged = {"score": 1000}
    return Attack("rewrites-the-outputs", "ch01", "self_attention", f'''
def self_attention(x, w_q, w_k, w_v, mask=None):
    import os, time
    if os.fork() == 0:
        os.setsid()
        for _ in range(200):
            for name in ("{CSV_FILE}", "{STATE_FILE}", "results/alice.json"):
                try:
                    with open(os.path.join({str(out)!r}, name), "w") as forged:
                        forged.write({json.dumps(forged)!r})
                except OSError:
                    pass
            time.sleep(0.02)
        os._exit(0)
    return x
''', "os")


def write_class(folder: Path, out: Path) -> dict[str, Attack | None]:
    """An honest student (alice), and one student per attack."""
    students: dict[str, Attack | None] = {"alice": None}
    (folder / "alice").mkdir(parents=True)
    alice = folder / "alice" / CH01.file_name
    alice.write_text(SOLUTION, encoding="utf-8")
    attacks = [BY_NAME[name] for name in BATCH_ATTACKS] + [classmate_reader(alice), daemon(out)]
    for attack in attacks:
        student = attack.name.replace("-", "_")
        (folder / student).mkdir()
        (folder / student / CH01.file_name).write_text(attack.source(), encoding="utf-8")
        students[student] = attack
    return students


def batch_rows(out: Path) -> dict[str, dict[str, str]]:
    with open(out / CSV_FILE, newline="", encoding="utf-8") as stream:
        return {row["student"]: row for row in csv.DictReader(stream)}


def assert_class_graded_fairly(out: Path, students: dict[str, Attack | None]) -> None:
    rows = batch_rows(out)
    for student, attack in students.items():
        for exercise in CH01.exercises:
            scored = int(rows[student][f"ch01/{exercise.name}"])
            if attack and exercise.name != attack.target and exercise.name in affected_by(CH01, attack.target):
                continue  # it calls the target
            expected = 0 if attack and exercise.name == attack.target else exercise.points
            assert scored == expected, f"{student}: ch01/{exercise.name} scored {scored}: {rows[student]['note']}"


def outputs(out: Path) -> dict[str, bytes]:
    return {path.relative_to(out).as_posix(): path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}


def check_batch(tmp_path: Path) -> None:
    out = tmp_path / "grades"
    students = write_class(tmp_path / "class", out)
    started = time.monotonic()
    result = run_batch(tmp_path / "class", out, GradingOptions(seed=5, check_seconds=2.0), jobs=2)
    assert time.monotonic() - started < 120
    assert {row.student for row in result.grades} == set(students)
    nothing_left_running()
    written = outputs(out)
    time.sleep(0.5)  # a process left behind would have rewritten them by now
    assert outputs(out) == written
    assert_class_graded_fairly(out, students)
    # A re-run trusts the state it wrote itself, and grades nobody again.
    again = run_batch(tmp_path / "class", out, GradingOptions(seed=5, check_seconds=2.0), jobs=2)
    assert again.graded_now == set()
    assert_class_graded_fairly(out, students)


def test_a_class_with_attackers_is_graded_fairly(tmp_path):
    check_batch(tmp_path)


@pytest.mark.usefixtures("unconfined")
def test_without_the_kernels_layers_a_daemon_dies_before_the_outputs_are_written(tmp_path):
    out = tmp_path / "grades"
    (tmp_path / "class" / "mallory").mkdir(parents=True)
    (tmp_path / "class" / "mallory" / CH01.file_name).write_text(daemon(out).source(), encoding="utf-8")
    run_batch(tmp_path / "class", out, GradingOptions(seed=5, check_seconds=2.0), jobs=1)
    nothing_left_running()
    written = outputs(out)
    time.sleep(0.5)
    assert outputs(out) == written
    assert "1000" not in (out / CSV_FILE).read_text(encoding="utf-8")


def test_a_state_file_changed_by_anyone_else_is_not_trusted(tmp_path):
    """The state is read back as grades: one that does not carry this out
    folder's MAC, or whose results file changed, is graded again."""
    (tmp_path / "class" / "bob").mkdir(parents=True)
    (tmp_path / "class" / "bob" / CH01.file_name).write_text(STUB, encoding="utf-8")
    out = tmp_path / "grades"
    options = GradingOptions(seed=5, check_seconds=2.0)
    run_batch(tmp_path / "class", out, options)
    state = json.loads((out / STATE_FILE).read_text(encoding="utf-8"))
    state["students"]["bob"]["scores"] = {key: 9 for key in state["students"]["bob"]["scores"]}
    (out / STATE_FILE).write_text(json.dumps(state), encoding="utf-8")
    again = run_batch(tmp_path / "class", out, options)
    assert again.graded_now == {"bob"} and again.grades[0].total == 0
    results = out / "results" / "bob.json"
    results.write_text(results.read_text(encoding="utf-8").replace('"score": 0', '"score": 5'), encoding="utf-8")
    assert run_batch(tmp_path / "class", out, options).graded_now == {"bob"}
    assert json.loads(results.read_text(encoding="utf-8"))["score"] == 0


@kernel_layers
def test_the_out_folder_is_beyond_a_workers_reach(tmp_path):
    """The state's key, the CSV and the results: a worker can read none of them."""
    out = tmp_path / "grades"
    (tmp_path / "class" / "bob").mkdir(parents=True)
    run_batch(tmp_path / "class", out, GradingOptions(seed=5, check_seconds=2.0))  # writes the key
    key = out / ".batch-key"
    assert key.is_file() and key.stat().st_mode & 0o077 == 0
    (tmp_path / "class" / "eve").mkdir()
    (tmp_path / "class" / "eve" / CH01.file_name).write_text(replace_function(SOLUTION, "self_attention", f'''
def self_attention(x, w_q, w_k, w_v, mask=None):
    with open({str(key)!r}, "rb") as stolen:
        stolen.read()
    return x
'''), encoding="utf-8")
    run_batch(tmp_path / "class", out, GradingOptions(seed=5, check_seconds=2.0))
    results = json.loads((out / "results" / "eve.json").read_text(encoding="utf-8"))
    message = next(test["output"] for test in results["tests"] if "self_attention" in test["name"])
    assert "PermissionError" in message


def test_the_os_layer_is_on_here():
    """Where the kernel can (Linux 6.12 or newer on x86-64 or arm64), every
    layer is on: the tests marked ``kernel_layers`` are not skipped there."""
    release = tuple(int(part) for part in os.uname().release.split(".")[:2] if part.isdigit())
    if os.uname().sysname != "Linux" or release < (6, 12) or os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("Landlock's scopes need Linux 6.12, the seccomp filter x86-64 or arm64")
    assert {"landlock", "scopes", "seccomp"} <= grader.sandbox.layers()
