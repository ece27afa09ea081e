"""Chapter 9 (the backward pass of tiled attention): the reference scores full marks and the
stub zero; what the reference's FlashAttentionFunction saves for backward is q, k, v, out
and lse and nothing else (saved_tensors_hooks), and an (L, S) tensor saved is noted with
its shape; each correct style's class trains as the
reference's does (the whole-course corpus test cannot call a torch.autograd.Function);
weights saved by forward, and backward by autograd through whole attention, get the right
numbers and fail the memory checks alone, each with its own hint, which for the class names
the pass that made the (L, S) tensor; a submission that skips the class by rewriting the
given flash_attention_gradients (and flash_attention) earns none of the class's points,
which the reference and each correct style earn through the given flash_attention and the
worker harness's own backward call; and the lesson's numbers are the reference's."""

import importlib.util
import math
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import Draw, result_of, solution_source, statuses, stub_source

from grader.catalog import COURSE_ROOT, find_chapter
from grader.chapters.ch09.test_ch09_flash_backward import (
    AUTOGRAD_THROUGH_BLOCKS_HINT,
    BACKWARD_MATRIX_HINT,
    BACKWARD_MEMORY_HINT,
    FORWARD_MEMORY_HINT,
    SAVED_WEIGHTS_HINT,
)
from grader.isolation import BUDGET_COUNTED
from grader.known_bugs import KNOWN_BUGS, apply_bug

CH09 = find_chapter("ch09")
SOLUTION = solution_source(CH09)
LESSON = COURSE_ROOT / "chapters" / CH09.folder
STYLES = sorted((COURSE_ROOT / "tests" / "correct_styles").glob("ch09_*.py"))


def _load(path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference():
    return _load(CH09.solution(), "reference_ch09_for_tests")


def _bug(name: str):
    return next(bug for bug in KNOWN_BUGS["ch09"] if bug.name == name)


def _pytorch(q, k, v, causal):
    """``(out, lse)`` of PyTorch's attention, bottom-right causal."""
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(k.shape[-2] - q.shape[-2]) if causal else None
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), torch.logsumexp(scores, dim=-1)


# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py)."""
    q, k, v = draw.randn(2, 6, 8), draw.randn(2, 10, 8), draw.randn(2, 10, 5)
    more_queries = draw.randn(2, 12, 8)  # causal with 12 queries and 10 keys: the first two see none
    calls = [
        ("flash_attention_forward", (q, k, v), {"block_size": 4}),
        ("flash_attention_forward", (q, k, v), {"causal": True, "block_size": 3}),
        ("flash_attention_forward", (more_queries, k, v), {"causal": True, "block_size": 4}),
    ]
    for queries, causal, block_size in ((q, False, 4), (q, True, 3), (more_queries, True, 4)):
        out, lse = _pytorch(queries, k, v, causal)
        upstream = draw.randn(*out.shape)
        calls.append(("flash_attention_backward", (queries, k, v, out, lse, upstream),
                      {"causal": causal, "block_size": block_size}))
    return calls


# FlashAttentionFunction is a torch.autograd.Function, which tests/test_correct_styles.py's
# calls (a function, or an nn.Module built and called) cannot make: its corpus files are
# compared with the reference below, through the given flash_attention_gradients.
UNSAMPLED = ("FlashAttentionFunction",)

# A known bug of grader/chapters/ch09/bugs.py that tests/test_release.py makes in both trees.
RELEASE_BUG = ("flash_attention_backward", "no-delta")


# -- the chapter's own ------------------------------------------------------------------


def test_solution_scores_full_marks_and_stub_scores_zero(grade_source):
    solved = grade_source(SOLUTION, chapter="ch09")
    assert solved.passed and solved.score == solved.max_score == 9
    stub = grade_source(stub_source(CH09), chapter="ch09")
    assert stub.score == 0
    assert set(statuses(stub).values()) == {"not implemented"}


def test_the_reference_saves_q_k_v_out_and_lse_only():
    """What ctx.save_for_backward keeps, as autograd's saved_tensors_hooks see it: five
    tensors, none of L x S numbers (the reference's forward runs with grad off inside, so
    its own operations save nothing)."""
    reference = _reference()
    q, k, v = (torch.randn(2, n, 8, dtype=torch.float64, requires_grad=True) for n in (5, 7, 7))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        out = reference.flash_attention(q, k, v, True, 3)
    assert saved == [(2, 5, 8), (2, 7, 8), (2, 7, 8), (2, 5, 8), (2, 5)]
    assert type(out.grad_fn).__name__ == "FlashAttentionFunctionBackward"


@pytest.mark.parametrize("path", STYLES, ids=[path.stem for path in STYLES])
def test_each_correct_style_trains_as_the_reference(path):
    reference, style = _reference(), _load(path, f"style_{path.stem}")
    draw = Draw(3)
    for num_queries, causal, block_size in ((6, False, 4), (6, True, 3), (12, True, 5)):
        q, k, v = draw.randn(2, num_queries, 8), draw.randn(2, 10, 8), draw.randn(2, 10, 5)
        grad_out = draw.randn(2, num_queries, 5)
        expected = reference.flash_attention_gradients(q, k, v, grad_out, causal, block_size)
        got = style.flash_attention_gradients(q, k, v, grad_out, causal, block_size)
        for name, mine, theirs in zip(("out", "dq", "dk", "dv"), got, expected):
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5, msg=f"{path.name}: {name}")


def _memory_failures(report, exercise: str) -> dict[str, tuple[str, str]]:
    return {check.check: (check.message, check.hint) for check in result_of(report, exercise).failed_checks}


# The class's two memory checks: through the given flash_attention_gradients, and through
# the given flash_attention backpropagated by the grader's own autograd call.
GIVEN_HELPER_MEMORY = "saves only q, k, v, out and lse for backward"
OWN_BACKWARD_MEMORY = "through the given flash_attention, backpropagated by the grader's own autograd call: forward"
OWN_BACKWARD_VALUES = "through the given flash_attention, backpropagated by the grader's own autograd call (not"


@pytest.mark.skipif(not BUDGET_COUNTED, reason="memory is counted by the kernel on Linux only")
def test_weights_saved_for_backward_fail_the_class_memory_checks_alone(grade_source):
    report = grade_source(apply_bug(SOLUTION, _bug("saves-the-weights")), chapter="ch09")
    assert statuses(report) == {"flash_attention_forward": "passed", "flash_attention_backward": "passed",
                                "FlashAttentionFunction": "failed"}
    failed = _memory_failures(report, "FlashAttentionFunction")
    assert sorted(title[:len(GIVEN_HELPER_MEMORY)] for title in failed) == sorted(
        [GIVEN_HELPER_MEMORY, OWN_BACKWARD_MEMORY[:len(GIVEN_HELPER_MEMORY)]])
    assert [hint for _, hint in failed.values()] == [SAVED_WEIGHTS_HINT] * 2
    given = next(message for title, (message, _) in failed.items() if title.startswith(GIVEN_HELPER_MEMORY))
    assert "(1, 1024, 4096)" in given


@pytest.mark.skipif(not BUDGET_COUNTED, reason="memory is counted by the kernel on Linux only")
def test_autograd_through_whole_attention_fails_memory_and_the_class_says_backward(grade_source):
    report = grade_source(apply_bug(SOLUTION, _bug("autograd-through-naive-attention")), chapter="ch09")
    assert statuses(report)["flash_attention_forward"] == "passed"
    failed = _memory_failures(report, "flash_attention_backward")
    memory = [(message, hint) for title, (message, hint) in failed.items() if "MiB of memory" in title]
    assert len(memory) == 1 and "needed more than 14 MiB" in memory[0][0] and memory[0][1] == BACKWARD_MEMORY_HINT
    # Its other failures: queries that see no key (L9-S6, causal), NaN from a softmax over no key.
    assert all("L9-S6" in title for title in failed if "MiB of memory" not in title)
    failed = _memory_failures(report, "FlashAttentionFunction")
    assert [hint for title, (_, hint) in failed.items() if "L9-S6" not in title] == [BACKWARD_MATRIX_HINT] * 2


@pytest.mark.skipif(not BUDGET_COUNTED, reason="memory is counted by the kernel on Linux only")
def test_a_whole_score_matrix_in_forward_is_named_in_the_class_check_too(grade_source):
    report = grade_source(apply_bug(SOLUTION, _bug("whole-score-matrix")), chapter="ch09")
    assert [hint for _, hint in _memory_failures(report, "flash_attention_forward").values()] == [FORWARD_MEMORY_HINT]
    assert [hint for _, hint in _memory_failures(report, "FlashAttentionFunction").values()] == \
        [FORWARD_MEMORY_HINT] * 2


# -- a submission that skips the class ------------------------------------------------------


def _without_the_class(source: str) -> str:
    """``source`` with FlashAttentionFunction's bodies unwritten, as the stub has them."""
    def the_class(text: str) -> str:
        return text[text.index("class FlashAttentionFunction"):text.index("def flash_attention(")]
    return source.replace(the_class(source), the_class(stub_source(CH09)))


GIVEN_HELPER = """    q, k, v = (tensor.detach().requires_grad_(True) for tensor in (q, k, v))
    out = flash_attention(q, k, v, causal, block_size)
    grads = torch.autograd.grad((out * grad_out).sum(), (q, k, v), allow_unused=True)
    return (out.detach(), *grads)
"""
# The given flash_attention_gradients rewritten to skip the class: the two functions called
# in its place, which gives the class's checks through it the right numbers in little memory.
DIRECT_HELPER = """    out, lse = flash_attention_forward(q, k, v, causal, block_size)
    return (out, *flash_attention_backward(q, k, v, out, lse, grad_out, causal, block_size))
"""
GIVEN_APPLY = "    return FlashAttentionFunction.apply(q, k, v, causal, block_size)\n"
# The given flash_attention rewritten too, to skip the class: its output differentiable by
# autograd through the blockwise forward, or not differentiable at all.
BYPASSES = {
    "helper-calls-the-functions": {GIVEN_HELPER: DIRECT_HELPER},
    "flash-attention-by-autograd-through-blocks": {
        GIVEN_HELPER: DIRECT_HELPER,
        GIVEN_APPLY: "    return flash_attention_forward(q, k, v, causal, block_size)[0]\n"},
    "flash-attention-not-differentiable": {
        GIVEN_HELPER: DIRECT_HELPER,
        GIVEN_APPLY: "    with torch.no_grad():\n        return flash_attention_forward(q, k, v, causal, block_size)[0]\n"},
}


def _bypassing(name: str) -> str:
    source = _without_the_class(SOLUTION)
    for old, new in BYPASSES[name].items():
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


@pytest.mark.parametrize("name", list(BYPASSES))
def test_skipping_the_class_through_the_given_functions_earns_none_of_its_points(grade_source, name):
    """The checks through the given flash_attention_gradients pass whatever that function
    does; those through the given flash_attention, backpropagated by the worker harness's
    own autograd call, fail every way around the class: a class never written raises, an
    output differentiable through the blockwise forward keeps every block's weights (over
    the memory budget, as the kernel counts it), one not differentiable has no gradients."""
    report = grade_source(_bypassing(name), chapter="ch09")
    assert statuses(report) == {"flash_attention_forward": "passed", "flash_attention_backward": "passed",
                                "FlashAttentionFunction": "failed"}
    failed = {check.check: check for check in result_of(report, "FlashAttentionFunction").failed_checks}
    # The checks through the given flash_attention_gradients pass (the note on what is saved
    # runs the given flash_attention, whose class, unwritten, raises).
    through_helper = ("through FlashAttentionFunction.apply", "matches the reference", GIVEN_HELPER_MEMORY,
                      "would run on a GPU too")
    assert not [title for title in failed if title.startswith(through_helper)]
    values = {title: check for title, check in failed.items() if title.startswith(OWN_BACKWARD_VALUES)}
    memory = {title: check for title, check in failed.items() if title.startswith(OWN_BACKWARD_MEMORY)}
    if name == "flash-attention-by-autograd-through-blocks":  # the right gradients, by autograd
        assert not values and BUDGET_COUNTED == bool(memory)
        assert all("MiB at once" in check.message and check.hint == AUTOGRAD_THROUGH_BLOCKS_HINT
                   for check in memory.values())
    elif name == "flash-attention-not-differentiable":
        assert len(values) == 5 and BUDGET_COUNTED == bool(memory)
        assert all(check.message.endswith("the output does not depend on the inputs through autograd")
                   for check in [*values.values(), *memory.values()])
    else:  # the class's forward raises NotImplementedError, in each of them
        assert len(values) == 5 and BUDGET_COUNTED == bool(memory)
        assert all(check.message == "not implemented yet" for check in failed.values())


@pytest.mark.parametrize("path", [CH09.solution(), *STYLES], ids=["reference", *(path.stem for path in STYLES)])
def test_the_class_through_the_grader_s_own_backward_gets_full_marks(grade_source, path):
    """What the bypasses above fail, the reference and each correct style pass."""
    report = grade_source(path.read_text(encoding="utf-8"), chapter="ch09", only={"FlashAttentionFunction"})
    ((result),) = report.exercises
    assert result.status == "passed", [(check.check, check.message) for check in result.failed_checks]
    assert sum(check.check.startswith("through the given flash_attention,") for check in result.checks) == 7


def _numbers(*values: float) -> list[str]:
    return [f"{value:.4f}" for value in values]


def test_the_lessons_worked_example_is_the_reference():
    """Section 4's one query over three keys, blocks of 2: the forward's running state, then
    the backward's P, D, dS and gradients."""
    reference = _reference()
    lesson = (LESSON / "README.md").read_text(encoding="utf-8")
    q = torch.tensor([[1.0]], dtype=torch.float64)  # (1, 1): d = 1, scale 1
    k = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64)  # (3, 1)
    v = torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64)  # (3, 1)
    grad_out = torch.tensor([[1.0]], dtype=torch.float64)  # (1, 1)
    shown = []
    m, l, acc = float("-inf"), 0.0, 0.0
    for start in (0, 2):
        scores, values = (q @ k[start:start + 2].T)[0], v[start:start + 2, 0]
        m_new = max(m, float(scores.max()))
        p = torch.exp(scores - m_new)
        rescale = math.exp(m - m_new)
        l, acc, m = l * rescale + float(p.sum()), acc * rescale + float(p @ values), m_new
        shown += _numbers(l, acc)
    out, lse = reference.flash_attention_forward(q, k, v, block_size=2)
    assert (float(out), float(lse)) == pytest.approx((acc / l, m + math.log(l)))
    weights = torch.exp(q @ k.T - lse[:, None])[0]  # (3,)
    delta = float(grad_out[0] @ out[0])
    d_scores = weights * (v[:, 0] - delta)  # dP = dO v^T = v here
    dq, dk, dv = reference.flash_attention_backward(q, k, v, out, lse, grad_out, block_size=2)
    torch.testing.assert_close(dk[:, 0], d_scores)
    torch.testing.assert_close(dv[:, 0], weights)
    shown += _numbers(float(out), float(lse), *weights.tolist(), delta, *d_scores.tolist(), float(dq))
    # And PyTorch's autograd agrees.
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    expected = torch.autograd.grad(F.scaled_dot_product_attention(*leaves).sum(), leaves)
    torch.testing.assert_close((dq, dk, dv), expected)
    text = re.sub(r"−", "-", lesson)
    missing = [number for number in shown if number not in text]
    assert not missing, f"numbers of the worked example missing from the lesson: {missing}"


def test_weights_given_to_save_for_backward_are_noted_with_their_shape(grade_source):
    """The note reads the worker's own saved_tensors_hooks: an (L, S) tensor among the saved
    ones is named with the hint of the weights kept for backward (the memory check fails it)."""
    source = SOLUTION.replace(
        "ctx.save_for_backward(q, k, v, out, lse)",
        "ctx.save_for_backward(q, k, v, out, lse, torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])"
        " - lse[..., None]))").replace("q, k, v, out, lse = ctx.saved_tensors", "q, k, v, out, lse, _ = ctx.saved_tensors")
    report = grade_source(source, chapter="ch09", only={"FlashAttentionFunction"})
    notes = [check for check in result_of(report, "FlashAttentionFunction").checks if check.note]
    assert len(notes) == 1 and "(2, 6, 10)" in notes[0].note and SAVED_WEIGHTS_HINT in notes[0].note
    assert result_of(report, "FlashAttentionFunction").failed_checks[0].hint == SAVED_WEIGHTS_HINT


def test_a_backward_that_would_fail_on_a_gpu_is_caught_past_a_rewritten_helper(grade_source):
    """The class's backward mixes a tensor made on the CPU into dq; a rewritten
    flash_attention_gradients that answers meta inputs without the class passes the
    portability check through it, and the one through the given flash_attention,
    backpropagated by the worker harness on meta, fails."""
    mixed = SOLUTION.replace("        return dq, dk, dv, None, None\n",
                             "        return dq + torch.zeros(dq.shape, dtype=dq.dtype), dk, dv, None, None\n")
    dodging = mixed.replace(GIVEN_HELPER, "    if q.is_meta:\n        return (torch.empty_like(grad_out), "
                            "torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))\n" + GIVEN_HELPER)
    assert SOLUTION != mixed != dodging
    report = grade_source(dodging, chapter="ch09", only={"FlashAttentionFunction"})
    ((title, (message, _)),) = _memory_failures(report, "FlashAttentionFunction").items()
    assert title.startswith("through the given flash_attention,") and "would run on a GPU too" in title
    assert message.startswith("flash_attention(") and "would fail on a GPU" in message
