"""What a worker refuses at torch's dispatcher (grader/refusals.py), route by route.

Each test installs an exercise's refusals in a forked child, as a worker
does before the student's first statement, and tries to reach the forbidden
computation there: the child reports, for each route, whether it was refused,
computed, or failed otherwise. Whole grades of these tricks are in
tests/test_attacks.py."""

from __future__ import annotations

import json
import os
import signal

import pytest

from grader.catalog import ATTENTION_CALLS, MULTI_HEAD_CALLS, SOFTMAX_CALLS
from grader.refusals import REFUSED
from test_attacks import unwrapping_subclass

# Each route computes a softmax of x (rows of 4) some way, returning a tensor.
SOFTMAX_ROUTES = {
    "functional": "torch.softmax(x, -1)",
    "method": "x.softmax(-1)",
    "nn.functional": "torch.nn.functional.softmax(x, -1)",
    "log_softmax": "torch.log_softmax(x, -1).exp()",
    "softmin": "torch.nn.functional.softmin(-x, -1)",
    "special": "torch.special.softmax(x, -1)",
    "nn.Softmax": "torch.nn.Softmax(dim=-1)(x)",
    "torch.ops": "torch.ops.aten._softmax.default(x, -1, False)",
    "torch.ops.out": "torch.ops.aten._softmax.out(x, -1, False, out=torch.empty_like(x))",
    "autograd": "torch.softmax(x.clone().requires_grad_(), -1)",
    "inference_mode": "(lambda: [torch.inference_mode().__enter__(), torch.softmax(x, -1)][1])()",
    "no_grad": "(lambda: [torch.no_grad().__enter__(), torch.softmax(x, -1)][1])()",
    "float64": "torch.softmax(x.double(), -1)",
    "vmap": "torch.vmap(lambda row: row.softmax(-1))(x)",
    "jit.trace": "torch.jit.trace(torch.nn.Softmax(dim=-1), x)(x)",
    "sparse": "torch.sparse.softmax(x.to_sparse(), -1).to_dense()",
    "nested": "torch.nested.nested_tensor([x[0], x[1]]).softmax(-1).to_padded_tensor(0.0)",
    "masked": "torch._masked_softmax(x, torch.zeros_like(x, dtype=torch.bool), -1, 0)",
    "sdpa with identity values": (
        "torch.nn.functional.scaled_dot_product_attention(x[:, None, :], torch.eye(4), torch.eye(4), scale=1.0)"
        "[:, 0, :]"),
    "multi-head attention": "torch.nn.MultiheadAttention(4, 1)(x[:, None], x[:, None], x[:, None])[1][0]",
    "modes popped": ("(lambda m: [m.__enter__(), torch.softmax(x, -1)][1])("
                     "torch.utils._python_dispatch._disable_current_modes())"),
    "torch functions off": ("(lambda m: [m.__enter__(), torch.softmax(x, -1)][1])("
                            "torch._C.DisableTorchFunction())"),
    "another thread": "run_in_thread(lambda: torch.softmax(x, -1))",
    "tensor subclass": "Unwrapping(x).softmax(-1)",
}

# What each child runs before the routes: helpers that a route's one line uses.
PRELUDE = '''
import threading
import torch
import torch.utils._python_dispatch

def run_in_thread(compute):
    found = {}
    def work():
        try:
            found["value"] = compute()
        except BaseException as error:
            found["error"] = error
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if "error" in found:
        raise found["error"]
    return found["value"]

''' + unwrapping_subclass("Unwrapping") + '''
try:
    x = torch.randn(3, 4)
except RuntimeError:  # an exercise without torch: no tensor can be made
    x = None
'''


def outcomes(forbidden: tuple[str, ...], routes: dict[str, str]) -> dict[str, str]:
    """``{route: "refused" | "computed" | "failed: ..."}`` in a child that
    installed the refusals of ``forbidden`` first."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            signal.alarm(60)  # a child that hangs ends, and the parent reads what it had
            # Forked from the test process, which earlier tests may have had run
            # OpenMP's threads: without them, a parallel op waits forever (as
            # every forked grading process knows, see batch.py).
            import torch

            torch.set_num_threads(1)
            from grader import refusals

            refusals.install(forbidden)
            namespace: dict = {}
            exec(PRELUDE, namespace)  # noqa: S102 - the test's own code, in the child
            found = {}
            for name, expression in routes.items():
                try:
                    eval(expression, namespace)  # noqa: S307
                    found[name] = "computed"
                except BaseException as error:  # noqa: BLE001 - each route's outcome is data
                    text = str(error)
                    found[name] = "refused" if REFUSED in text else f"failed: {type(error).__name__}: {text[:200]}"
            os.write(write, json.dumps(found).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as stream:
        data = stream.read()
    _, status = os.waitpid(pid, 0)
    assert data, f"the child ended without an answer (wait status {status})"
    return json.loads(data)


def test_every_route_to_a_softmax_is_refused_where_softmax_is_the_exercise():
    found = outcomes(SOFTMAX_CALLS, SOFTMAX_ROUTES)
    assert found == dict.fromkeys(SOFTMAX_ROUTES, "refused")


def test_an_exercise_that_forbids_nothing_computes_every_route():
    """The same routes where nothing is forbidden: each computes, so that the
    test above shows refusals, not routes that fail by themselves."""
    found = outcomes((), SOFTMAX_ROUTES)
    assert found == dict.fromkeys(SOFTMAX_ROUTES, "computed")


ATTENTION_ROUTES = {
    "sdpa": "torch.nn.functional.scaled_dot_product_attention(x[None], x[None], x[None])",
    "sdpa with a mask (math path)": (
        "torch.nn.functional.scaled_dot_product_attention(x[None], x[None], x[None], "
        "attn_mask=torch.ones(3, 3, dtype=torch.bool))"),
    "sdpa float64 (math path)": "torch.nn.functional.scaled_dot_product_attention(x[None].double(), "
                                "x[None].double(), x[None].double())",
    "sdpa in a thread": "run_in_thread(lambda: torch.nn.functional.scaled_dot_product_attention(x, x, x))",
    "flash kernel by name": "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(x[None, None], "
                            "x[None, None], x[None, None])",
    "multi_head_attention_forward": (
        "torch.nn.functional.multi_head_attention_forward(x[:, None], x[:, None], x[:, None], 4, 1, "
        "torch.randn(12, 4), None, None, None, False, 0.0, torch.randn(4, 4), None)"),
    "nn.MultiheadAttention": "torch.nn.MultiheadAttention(4, 2)(x[:, None], x[:, None], x[:, None])",
    "transformer layer fast path": (
        "(lambda layer: [layer.eval(), torch.no_grad().__enter__(), layer(x[None])][2])("
        "torch.nn.TransformerEncoderLayer(4, 2, 8, batch_first=True))"),
}
# What the attention exercises may still use.
ALLOWED_IN_ATTENTION = {
    "softmax": "torch.softmax(x, -1)",
    "matmul": "x @ x.T",
    "masked_fill": "x.masked_fill(x > 0, float('-inf'))",
}


def test_fused_attention_is_refused_where_attention_is_the_exercise():
    found = outcomes(ATTENTION_CALLS, {**ATTENTION_ROUTES, **ALLOWED_IN_ATTENTION})
    assert found == {**dict.fromkeys(ATTENTION_ROUTES, "refused"), **dict.fromkeys(ALLOWED_IN_ATTENTION, "computed")}


def test_the_librarys_multi_head_attention_is_refused_from_chapter_3_on():
    routes = {name: ATTENTION_ROUTES[name] for name in (
        "multi_head_attention_forward", "nn.MultiheadAttention", "transformer layer fast path")}
    routes["quantizable MultiheadAttention"] = (
        "__import__('torch.ao.nn.quantizable', fromlist=['x']).MultiheadAttention(4, 2)"
        "(x[:, None], x[:, None], x[:, None])")
    allowed = {"sdpa": ATTENTION_ROUTES["sdpa"], "softmax": "torch.softmax(x, -1)"}
    found = outcomes(MULTI_HEAD_CALLS, {**routes, **allowed})
    assert found == {**dict.fromkeys(routes, "refused"), **dict.fromkeys(allowed, "computed")}


def test_without_torch_no_operator_computes_and_numpy_still_does():
    routes = {
        "a factory": "torch.ones(3)",
        "arithmetic on an array turned tensor": "torch.from_numpy(__import__('numpy').ones(3)) + 1",
        "a softmax on one": "torch.from_numpy(__import__('numpy').ones(3)).softmax(-1)",
        "a module": "torch.nn.Linear(2, 2)",
        "in a thread": "run_in_thread(lambda: torch.from_numpy(__import__('numpy').ones(3)).exp())",
        "scipy's softmax": "__import__('scipy.special', fromlist=['x']).softmax(__import__('numpy').ones(3))",
    }
    numpy = {"numpy": "__import__('numpy').exp(__import__('numpy').ones(3)).sum()"}
    # The prelude makes a tensor: without torch, the child starts from NumPy alone.
    found = outcomes(("torch", "scipy.special.softmax"), {**routes, **numpy})
    assert found == {**dict.fromkeys(routes, "refused"), **dict.fromkeys(numpy, "computed")}


@pytest.mark.parametrize("forbidden", [SOFTMAX_CALLS, ("torch",)], ids=["softmax", "whole-library"])
def test_refusals_cannot_be_undone_from_python(forbidden):
    """Nothing Python can reach puts a kernel back: no handle of the
    registrations is left among the objects the garbage collector knows."""
    routes = {"reset every dispatch library": (
        "(lambda resets: torch.from_numpy(__import__('numpy').ones((3, 4), dtype='float32')).softmax(-1))("
        "[m.reset() for o in __import__('gc').get_objects() for m in __import__('gc').get_referents(o) "
        "if type(m).__name__ == '_DispatchModule'])")}
    assert outcomes(forbidden, routes) == {"reset every dispatch library": "refused"}
