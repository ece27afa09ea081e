"""Hidden checks for chapter 9: the backward pass of tiled attention.

Every exercise is checked against PyTorch and against the reference, in
float64 (compared at float32's tolerance, the course's rule): the forward
pass against ``F.scaled_dot_product_attention`` (with chapter 4's
bottom-right causal mask as its ``attn_mask``) and ``torch.logsumexp`` of
the masked scaled scores; the backward pass and ``FlashAttentionFunction``
against the gradients autograd takes through ``F.scaled_dot_product_attention``
(chapter 1's attention), for the loss ``sum(out * grad_out)``. The cases
take block sizes that divide the keys and that do not (1, 3, all of them,
more than all of them), unequal query and key lengths, causal and not,
queries that see no key, and batch and head dimensions. On a mismatch,
known wrong implementations are run on the same inputs and a matching
one's hint goes with the failure.

``FlashAttentionFunction`` is called two ways. Through the file's given
``flash_attention_gradients``, which runs ``FlashAttentionFunction.apply``
and backpropagates ``grad_out`` through it by autograd: these checks pass on
the known bugs' hints. But that function is the file's, and a file may
rewrite it to skip the class; so the points rest on the checks that call the
given ``flash_attention`` (``FlashAttentionFunction.apply``) and let the
worker harness backpropagate ``grad_out`` from its output by its own autograd
call (``submission.call(..., grad=...)``, ``grader.worker``): an output
autograd cannot differentiate has no gradients, and one differentiable
through the blockwise forward instead of through the class keeps every
block's weights, over the memory budget. Their answers are compared with
the oracle's (recorded in the student edition), never with the reference's;
a known bug's hint comes from its answer to the same inputs through
``flash_attention_gradients``.

Memory is the chapter's point, and the kernel's count decides it
(``run_within``, or ``budget`` with ``grad``): each exercise runs with 1024
queries, 4096 keys and blocks of 256 in a worker of its own that may map 14
MiB beyond what it maps before the file's first statement. The (L, S)
scores alone take 16 MiB in float32, so building them in either pass, or
keeping the (L, S) weights from forward to backward (the class's forward and
backward run in the one call), fails, whatever the code does to hide it.
The worker's own measure (``footprint``) of the largest tensor then words
the message, and for the class says whether forward or backward made it.
"""

import ast

import pytest
import torch

from grader.chapters.ch09.bugs import BUGS
from grader.checks import (
    Oracles,
    case_ids,
    exercise,
    expect_portable,
    portability,
    portability_check,
    portable,
    run,
    run_within,
)
from grader.compare import CheckFailure, expect_close, fail, note, shape_text, unpack
from grader.isolation import BUDGET_COUNTED
from grader.outcomes import Failure

# PyTorch's attention, its log-sum-exp and its gradients by autograd (oracles.py).
oracles = Oracles("ch09")


def _hint(exercise_name: str, name: str) -> str:
    return next(bug.hint for bug in BUGS if bug.exercise == exercise_name and bug.name == name)


FORWARD_MEMORY_HINT = _hint("flash_attention_forward", "whole-score-matrix")
BACKWARD_MEMORY_HINT = _hint("flash_attention_backward", "autograd-through-naive-attention")
SAVED_WEIGHTS_HINT = _hint("FlashAttentionFunction", "saves-the-weights")
# Both passes of the class ran in the one call; the largest tensor made in backward is the
# backward's whole matrix, which FlashAttentionFunction inherits from flash_attention_backward.
BACKWARD_MATRIX_HINT = ("looks like backward holds an (L, S) tensor (scores, weights or their gradients) "
                        "at once: flash_attention_backward takes the keys block_size at a time and "
                        "rebuilds each block's weights from lse")
# The memory went where flash_attention_forward makes its (L, block) pieces, none of them
# (L, S): autograd recorded the forward pass, keeping every block's weights for backward.
AUTOGRAD_THROUGH_BLOCKS_HINT = ("looks like autograd recorded the blockwise forward pass, keeping every block's "
                                "weights for backward, (L, S) numbers in all: flash_attention returns "
                                "FlashAttentionFunction.apply(...), whose forward runs with gradient tracking "
                                "off and saves only q, k, v, out and lse, and whose backward rebuilds the "
                                "weights block by block")

# (id, batch dims, L, S, d, d_v, block_size, causal)
CASES = [
    ("L6-S10-block3", (2,), 6, 10, 8, 8, 3, False),
    ("L6-S10-block4-causal", (2,), 6, 10, 8, 8, 4, True),
    ("L10-S10-block3-causal", (1,), 10, 10, 4, 4, 3, True),
    ("L7-S9-block1", (1,), 7, 9, 4, 3, 1, False),
    ("L5-S8-block8-causal", (2,), 5, 8, 4, 4, 8, True),
    ("L6-S9-block16", (2,), 6, 9, 4, 5, 16, False),
    ("B2-H3-L4-S7-block2-causal", (2, 3), 4, 7, 4, 4, 2, True),
    ("L9-S6-block4-causal", (1,), 9, 6, 4, 4, 4, True),  # queries 0 .. 2 see no key
]


def _inputs(inputs, case, dtype=torch.float64):
    """``(q, k, v, grad_out)`` of a case."""
    _, batch, num_queries, num_keys, width, value_width, _, _ = case
    return (inputs.randn(*batch, num_queries, width, dtype=dtype),
            inputs.randn(*batch, num_keys, width, dtype=dtype),
            inputs.randn(*batch, num_keys, value_width, dtype=dtype),
            inputs.randn(*batch, num_queries, value_width, dtype=dtype))


def _pytorch(causal: bool, num_queries: int, num_keys: int, what: str) -> str:
    """What a result is compared with, for messages."""
    if not causal:
        return what
    offset = num_keys - num_queries
    return (f"{what} with chapter 4's causal mask ({num_queries} queries, {num_keys} keys: query i sees "
            f"keys 0 .. i {'+' if offset >= 0 else '-'} {abs(offset)})")


def _expect_parts(got, call: str, expected, names, lookalikes=None, reference: str = "the reference") -> None:
    """A tuple answer, item by item in order; a gradient that is None is named as one."""
    parts = unpack(got, names, call)
    for index, (name, part, right) in enumerate(zip(names, parts, expected)):
        if part is None and name.startswith("d"):
            fail(f"{call}: {name} is None: autograd reached no gradient of {name[1:]} (did backward "
                 f"return None in its place?)", hint=_matching(lookalikes, index, got))
        expect_close(part, right, f"{name} of {call}", reference=reference,
                     lookalikes=lookalikes.part(index, got) if lookalikes else None)


def _matching(lookalikes, index: int, got) -> str | None:
    """The hint of a known bug whose answer has None where ``got`` has it."""
    if lookalikes is None:
        return None
    for hint, output in lookalikes.part(index, got)():
        if output is None:
            return hint
    return None


# -- flash_attention_forward ---------------------------------------------------------------


@exercise("flash_attention_forward")
@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_forward_equals_pytorch_attention(submission, bugs, inputs, case):
    """equals F.scaled_dot_product_attention, lse torch.logsumexp of the scaled scores (causal: bottom-right)"""
    q, k, v, _ = _inputs(inputs, case)
    block_size, causal = case[-2:]
    got, call = run(submission, "flash_attention_forward", q, k, v, causal=causal, block_size=block_size)
    expected = oracles.attention_with_lse(q, k, v, causal)
    lookalikes = bugs.flash_attention_forward(q, k, v, causal=causal, block_size=block_size)
    out, lse = unpack(got, ("out", "lse"), call)
    length, keys = q.shape[-2], k.shape[-2]
    expect_close(out, expected[0], f"out of {call}", lookalikes=lookalikes.part(0, got),
                 reference=_pytorch(causal, length, keys, "F.scaled_dot_product_attention"))
    expect_close(lse, expected[1], f"lse of {call}", lookalikes=lookalikes.part(1, got),
                 reference=_pytorch(causal, length, keys, "torch.logsumexp of the scaled scores"))


@exercise("flash_attention_forward")
@pytest.mark.parametrize("case", CASES[1::3], ids=case_ids(CASES[1::3]))
def test_forward_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    q, k, v, _ = _inputs(inputs, case)
    block_size, causal = case[-2:]
    got, call = run(submission, "flash_attention_forward", q, k, v, causal=causal, block_size=block_size)
    _expect_parts(got, call, reference.flash_attention_forward(q, k, v, causal=causal, block_size=block_size),
                  ("out", "lse"), bugs.flash_attention_forward(q, k, v, causal=causal, block_size=block_size))


# -- flash_attention_backward --------------------------------------------------------------


@exercise("flash_attention_backward")
@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_backward_equals_autograd(submission, bugs, inputs, case):
    """equals the gradients autograd takes through F.scaled_dot_product_attention (float64; causal: bottom-right)"""
    q, k, v, grad_out = _inputs(inputs, case)
    block_size, causal = case[-2:]
    out, lse = oracles.attention_with_lse(q, k, v, causal)
    got, call = run(submission, "flash_attention_backward", q, k, v, out, lse, grad_out, causal=causal,
                    block_size=block_size)
    _, *grads = oracles.attention_gradients(q, k, v, grad_out, causal)
    _expect_parts(got, call, grads, ("dq", "dk", "dv"),
                  bugs.flash_attention_backward(q, k, v, out, lse, grad_out, causal=causal, block_size=block_size),
                  reference=_pytorch(causal, q.shape[-2], k.shape[-2],
                                     "autograd through F.scaled_dot_product_attention"))


@exercise("flash_attention_backward")
@pytest.mark.parametrize("case", CASES[::3], ids=case_ids(CASES[::3]))
def test_backward_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    q, k, v, grad_out = _inputs(inputs, case)
    block_size, causal = case[-2:]
    out, lse = oracles.attention_with_lse(q, k, v, causal)
    got, call = run(submission, "flash_attention_backward", q, k, v, out, lse, grad_out, causal=causal,
                    block_size=block_size)
    _expect_parts(got, call,
                  reference.flash_attention_backward(q, k, v, out, lse, grad_out, causal=causal,
                                                     block_size=block_size),
                  ("dq", "dk", "dv"),
                  bugs.flash_attention_backward(q, k, v, out, lse, grad_out, causal=causal, block_size=block_size))


# -- FlashAttentionFunction ----------------------------------------------------------------


# The class wires the two functions together: the cases that tell its mistakes apart (causal
# and not, L = S for gradients in each other's place, L != S, queries that see no key, blocks
# of 1 and of more than S), fewer than its parts'.
FUNCTION_CASES = [CASES[1], CASES[2], CASES[3], CASES[5], CASES[7]]


@exercise("FlashAttentionFunction")
@pytest.mark.parametrize("case", FUNCTION_CASES, ids=case_ids(FUNCTION_CASES))
def test_function_trains_like_pytorch_attention(submission, bugs, inputs, case):
    """through FlashAttentionFunction.apply and autograd, gives F.scaled_dot_product_attention's output and gradients (float64)"""
    q, k, v, grad_out = _inputs(inputs, case)
    block_size, causal = case[-2:]
    got, call = run(submission, "flash_attention_gradients", q, k, v, grad_out, causal, block_size)
    _expect_parts(got, call, oracles.attention_gradients(q, k, v, grad_out, causal), ("out", "dq", "dk", "dv"),
                  bugs.flash_attention_gradients(q, k, v, grad_out, causal, block_size),
                  reference=_pytorch(causal, q.shape[-2], k.shape[-2], "F.scaled_dot_product_attention and "
                                     "autograd through it"))


@exercise("FlashAttentionFunction")
@pytest.mark.parametrize("case", CASES[2::3], ids=case_ids(CASES[2::3]))
def test_function_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    q, k, v, grad_out = _inputs(inputs, case)
    block_size, causal = case[-2:]
    got, call = run(submission, "flash_attention_gradients", q, k, v, grad_out, causal, block_size)
    _expect_parts(got, call, reference.flash_attention_gradients(q, k, v, grad_out, causal, block_size),
                  ("out", "dq", "dk", "dv"), bugs.flash_attention_gradients(q, k, v, grad_out, causal, block_size))


def _backpropagated(submission, args: tuple, grad_out: torch.Tensor, budget: int = 0, portability: bool = False):
    """``((out, dq, dk, dv), call)``: the given ``flash_attention(*args)``, which
    applies ``FlashAttentionFunction``, run in the worker; then the worker's own
    harness, not the file's code, backpropagates ``sum(out * grad_out)`` through
    its output by autograd (``grader.worker``). An output autograd cannot
    differentiate fails here: "the output does not depend on the inputs
    through autograd". ``budget`` and ``portability`` as ``submission.call``
    takes them (with ``portability``, nothing is returned)."""
    grad = {"wrt": [0, 1, 2], "output": None, "grad_output": grad_out}
    call = (f"{submission.call_text('flash_attention', args, {})}, then autograd from grad_out "
            f"{shape_text(grad_out.shape)}")
    answer = submission.call("flash_attention", args, {}, grad=grad, budget=budget, portability=portability)
    if portability:
        return None, call
    out, grads = answer
    return (out, *grads), call


@exercise("FlashAttentionFunction")
@pytest.mark.parametrize("case", FUNCTION_CASES, ids=case_ids(FUNCTION_CASES))
def test_function_backpropagates_like_pytorch_attention(submission, bugs, inputs, case):
    """through the given flash_attention, backpropagated by the grader's own autograd call (not by flash_attention_gradients), gives F.scaled_dot_product_attention's output and gradients (float64)"""
    q, k, v, grad_out = _inputs(inputs, case)
    block_size, causal = case[-2:]
    got, call = _backpropagated(submission, (q, k, v, causal, block_size), grad_out)
    _expect_parts(got, call, oracles.attention_gradients(q, k, v, grad_out, causal), ("out", "dq", "dk", "dv"),
                  bugs.flash_attention_gradients(q, k, v, grad_out, causal, block_size),
                  reference=_pytorch(causal, q.shape[-2], k.shape[-2], "F.scaled_dot_product_attention and "
                                     "autograd through it"))


@exercise("FlashAttentionFunction")
def test_function_saves_q_k_v_out_and_lse(submission, inputs):
    """saves q, k, v, out and lse with ctx.save_for_backward (a note, from your process's own saved_tensors_hooks: it costs no point)"""
    q, k, v, _ = _inputs(inputs, CASES[1], torch.float32)
    got, call = run(submission, "saved_for_backward", q, k, v, True, 4)
    length, keys = q.shape[-2], k.shape[-2]
    expected = [tuple(q.shape), tuple(k.shape), tuple(v.shape), tuple(q.shape), tuple(q.shape[:-1])]
    if not isinstance(got, (list, tuple)) or not all(isinstance(shape, tuple) for shape in got):
        return  # the given function changed: nothing to read
    if sorted(got) == sorted(expected):
        return
    listed = ", ".join(str(shape) for shape in got) or "nothing"
    whole = [shape for shape in got if tuple(shape[-2:]) == (length, keys)]
    if whole:
        note(f"{call}: forward saved {len(got)} tensors for backward ({listed}), among them an (L, S) one "
             f"{whole[0]}: the memory check counts it", hint=SAVED_WEIGHTS_HINT)
    note(f"{call}: forward saved {len(got)} tensors for backward ({listed}); q, k, v, out and lse are "
         f"{', '.join(str(shape) for shape in expected)}", moot_if_failed=True)


# -- memory, as the kernel counts it -------------------------------------------------------

# What each exercise, with L = 1024 queries and S = 4096 keys (d = d_v = 8, blocks of 256),
# may map beyond what its worker maps before the file runs, as the kernel counts it. The
# (L, S) scores alone take 16 MiB in float32, however they are computed; autograd through
# whole attention keeps two such tensors and more, and weights saved by forward are still
# held while backward runs (the class's check runs both passes in one call). An (L, block)
# piece takes 1 MiB: from that size on, glibc gives each allocation a mapping of its own,
# unmapped when freed (grader.isolation), so pieces freed block after block leave no holes
# in the heap; with smaller pieces, a list of per-block results kept between them (dk and
# dv blocks joined by torch.cat at the end, a common style) left about one piece a block
# behind, as much as the (L, S) matrix in all. Measured on Linux with torch 2.13
# (tests/test_ch09_flash_backward.py): the reference and the correct-style corpus need at
# most 8 MiB; the known bugs that hold an (L, S) float32 tensor more than 22. 14 MiB is 6
# above the first and 8 below the second.
MEMORY_BUDGET = 14 * 2**20
MEMORY_SIZES = (1024, 4096, 8, 256)  # L, S, d, block_size
LAST_QUERIES = 32  # of the 1024: their outputs and dq are compared with the reference's on them alone


def _memory_inputs(inputs):
    num_queries, num_keys, width, _ = MEMORY_SIZES
    return (inputs.randn(1, num_queries, width), inputs.randn(1, num_keys, width), inputs.randn(1, num_keys, width),
            inputs.randn(1, num_queries, width))


def _last(tensors, count: int = LAST_QUERIES) -> tuple:
    """The last ``count`` queries of each (L, ...) tensor (an lse: of its last axis). As the
    last rows they keep their bottom-right positions S - count + i: their outputs, lse and
    dq are those of the whole call, computed at a fraction of its cost."""
    return tuple(t[..., -count:] if t.dim() == 2 else t[..., -count:, :] for t in tensors)


def _expect_last(got, call: str, names, shapes, expected_last) -> None:
    """``got``'s shapes, then its last queries against ``expected_last`` (items None: not compared)."""
    parts = unpack(got, names, call)
    for name, part, shape in zip(names, parts, shapes):
        if part is None or not isinstance(part, torch.Tensor) or tuple(part.shape) != shape:
            expect_close(part, torch.zeros(shape), f"{name} of {call}")  # the shape's (or None's) message
    last = [_last((part,))[0] for part, right in zip(parts, expected_last) if right is not None]
    _expect_parts(tuple(last), f"{call} at its last {LAST_QUERIES} queries", [r for r in expected_last if r is not None],
                  tuple(name for name, right in zip(names, expected_last) if right is not None))


@exercise("flash_attention_forward")
def test_forward_never_builds_the_score_matrix(submission, reference, inputs):
    """with 1024 queries, 4096 keys and blocks of 256, needs no more than 14 MiB of memory, as the kernel counts it (the (L, S) scores alone take 16 MiB)"""
    q, k, v, _ = _memory_inputs(inputs)
    block_size = MEMORY_SIZES[-1]
    got, call = run_within(submission, MEMORY_BUDGET, "flash_attention_forward", q, k, v, causal=False,
                           block_size=block_size, hint=FORWARD_MEMORY_HINT)
    # The values show that the budget was not kept by computing worse; the other checks
    # judge them, so the last queries alone are compared, the reference run on them alone.
    (q_last,) = _last((q,))
    _expect_last(got, call, ("out", "lse"), (tuple(q.shape), tuple(q.shape[:-1])),
                 reference.flash_attention_forward(q_last, k, v, False, block_size))


@exercise("flash_attention_backward")
def test_backward_never_builds_the_score_matrix(submission, reference, inputs):
    """with 1024 queries, 4096 keys and blocks of 256, needs no more than 14 MiB of memory, as the kernel counts it (the (L, S) weights alone take 16 MiB)"""
    q, k, v, grad_out = _memory_inputs(inputs)
    block_size = MEMORY_SIZES[-1]
    out, lse = reference.flash_attention_forward(q, k, v, True, block_size)
    got, call = run_within(submission, MEMORY_BUDGET, "flash_attention_backward", q, k, v, out, lse, grad_out,
                           causal=True, block_size=block_size, hint=BACKWARD_MEMORY_HINT)
    q_last, out_last, lse_last, grad_last = _last((q, out, lse, grad_out))
    dq_last = reference.flash_attention_backward(q_last, k, v, out_last, lse_last, grad_last, True, block_size)[0]
    _expect_last(got, call, ("dq", "dk", "dv"), (tuple(q.shape), tuple(k.shape), tuple(v.shape)),
                 (dq_last, None, None))


@exercise("FlashAttentionFunction")
def test_function_keeps_no_score_matrix_for_backward(submission, reference, inputs):
    """saves only q, k, v, out and lse for backward: forward then backward, with 1024 queries, 4096 keys and blocks of 256, need no more than 14 MiB of memory, as the kernel counts it (the (L, S) weights alone take 16 MiB)"""
    q, k, v, grad_out = _memory_inputs(inputs)
    args = (q, k, v, grad_out, True, MEMORY_SIZES[-1])
    try:
        got, call = run_within(submission, MEMORY_BUDGET, "flash_attention_gradients", *args)
    except CheckFailure as failure:
        if failure.kind == Failure.MEMORY and failure.hint is None:
            failure.hint = _which_pass(submission, args)
        raise
    q_last, grad_last = _last((q, grad_out))
    out_last, dq_last, _, _ = reference.flash_attention_gradients(q_last, k, v, grad_last, True, MEMORY_SIZES[-1])
    _expect_last(got, call, ("out", "dq", "dk", "dv"),
                 (tuple(q.shape), tuple(q.shape), tuple(k.shape), tuple(v.shape)), (out_last, dq_last, None, None))


@exercise("FlashAttentionFunction")
def test_function_backpropagates_within_memory(submission, inputs):
    """through the given flash_attention, backpropagated by the grader's own autograd call: forward then backward, with 1024 queries, 4096 keys and blocks of 256, need no more than 14 MiB of memory, as the kernel counts it (autograd through blockwise code keeps every block's weights, 16 MiB in all)"""
    if not BUDGET_COUNTED:
        pytest.skip("memory is counted by the kernel on Linux only: not measured on this system")
    q, k, v, grad_out = _memory_inputs(inputs)
    causal, block_size = True, MEMORY_SIZES[-1]
    try:
        got, call = _backpropagated(submission, (q, k, v, causal, block_size), grad_out, budget=MEMORY_BUDGET)
    except CheckFailure as failure:
        if failure.kind == Failure.MEMORY and failure.hint is None:
            failure.hint = _which_pass(submission, (q, k, v, grad_out, causal, block_size))
        raise
    # Every value, against PyTorch's (computed in float64, compared in float32): the budget
    # was not kept by computing less.
    _expect_parts(got, call, oracles.attention_gradients(q, k, v, grad_out, causal), ("out", "dq", "dk", "dv"),
                  reference=_pytorch(causal, q.shape[-2], k.shape[-2], "F.scaled_dot_product_attention and "
                                     "autograd through it"))


def _which_pass(submission, args: tuple) -> str:
    """The hint for the largest tensor of a call over its budget, by the function or
    method that made it: forward (weights saved for backward, a whole score matrix in
    flash_attention_forward, or, where its largest tensor is smaller than that, the
    forward's blocks recorded by autograd) or backward. From the worker's own measure
    of the given flash_attention_gradients, which words the message only: the kernel
    has decided."""
    try:
        largest = submission.call("flash_attention_gradients", args, {}, measure=True)[1].largest
    except CheckFailure as failure:
        largest = getattr(failure, "largest", None)
    except AttributeError:  # no footprint measured
        largest = None
    line = largest.line if largest is not None else 0
    try:
        tree = ast.parse(submission.submission.source)
    except (AttributeError, SyntaxError, ValueError):
        return SAVED_WEIGHTS_HINT
    made_in = ""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.lineno <= (line or 0) <= (node.end_lineno or node.lineno):
            made_in = node.name  # the innermost: ast.walk goes outside in
    if made_in in ("backward", "flash_attention_backward"):
        return BACKWARD_MATRIX_HINT
    if made_in == "flash_attention_forward":
        num_queries, num_keys = args[0].shape[-2], args[1].shape[-2]
        return FORWARD_MEMORY_HINT if largest.numel >= num_queries * num_keys else AUTOGRAD_THROUGH_BLOCKS_HINT
    return SAVED_WEIGHTS_HINT


# -- every exercise -----------------------------------------------------------------------


def _backward_args(inputs):
    q, k, v, grad_out = _inputs(inputs, CASES[1], torch.float32)
    return (q, k, v, *oracles.attention_with_lse(q, k, v, True), grad_out), {"causal": True, "block_size": 4}


test_would_run_on_a_gpu = portability_check([
    portable("flash_attention_forward", lambda inputs: (
        _inputs(inputs, CASES[1], torch.float32)[:3], {"causal": True, "block_size": 4})),
    portable("flash_attention_backward", _backward_args),
])


# The class, through the given function that applies it and backpropagates: a check of
# its own, since a portable(...) case calls the exercise by its name.
@exercise("FlashAttentionFunction")
@portability
def test_function_would_run_on_a_gpu(submission, inputs):
    """would run on a GPU too: runs with its inputs on meta, where a tensor made on the CPU cannot meet them"""
    expect_portable(submission, "flash_attention_gradients", *_inputs(inputs, CASES[1], torch.float32), True, 4)


@exercise("FlashAttentionFunction")
@portability
def test_function_backpropagates_on_a_gpu_too(submission, inputs):
    """through the given flash_attention, backpropagated by the grader's own autograd call, would run on a GPU too: forward and backward run with their inputs on meta"""
    q, k, v, grad_out = _inputs(inputs, CASES[1], torch.float32)
    _backpropagated(submission, (q, k, v, True, 4), grad_out, portability=True)
