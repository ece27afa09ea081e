"""Hidden checks for chapter 3: heads, multi-head attention, nn.MultiheadAttention.

Every exercise is checked four ways: against the reference solution on
several shapes, against an independent oracle (slices and loops,
``F.scaled_dot_product_attention`` head by head, and PyTorch's own
``nn.MultiheadAttention`` with the same weights loaded), against properties
any correct answer has, and, on a mismatch, against known wrong
implementations, whose hint then goes with the failure.

Most cases keep ``T != H`` and use more than one head and more than one
token: a heads axis left in the wrong place then changes the shape, and a
reshape without a transpose changes the values.

``parameter_count`` is a formula: it is also asked for a model too wide to
build (d_model = 1,000,000) and measured by the worker (``grader.footprint``),
so that counting the parameters of a module built for the purpose, on the
meta device too, makes a tensor and fails.
"""

import pytest
import torch

from grader.checks import (
    case_ids,
    exercise,
    expect_attention,
    expect_finite,
    expect_gradients,
    expect_module_matches_reference,
    expect_raises,
    Oracles,
    portability_check,
    portable,
    reference_module_call,
    run,
    run_measured,
    run_module,
    run_with_gradients,
)
from grader.compare import (
    CheckFailure,
    Compared,
    describe,
    expect_close,
    expect_like,
    expect_true,
    fail,
    shape_text,
    unpack,
)
from grader.footprint import PartlyMeasured
from grader.module_calls import ModuleCall
from grader.outcomes import Failure

oracles = Oracles("ch03")


def _weight(inputs, d_out: int, d_in: int, dtype=torch.float32) -> torch.Tensor:
    """A random (d_out, d_in) weight scaled like nn.Linear's, so softmaxes stay soft."""
    return inputs.randn(d_out, d_in, dtype=dtype) / d_in ** 0.5


# -- split_heads -------------------------------------------------------------------------

# (id, x shape, H): no batch dimension, one, two; one head; head width 1; odd T.
SPLIT_CASES = [
    ("T5-D6-H2", (5, 6), 2),
    ("B2-T5-D8-H4", (2, 5, 8), 4),
    ("B2x3-T4-D12-H3", (2, 3, 4, 12), 3),
    ("B2-T7-D6-H1", (2, 7, 6), 1),
    ("B3-T4-D5-H5-d1", (3, 4, 5), 5),
]


@exercise("split_heads")
@pytest.mark.parametrize("case", SPLIT_CASES, ids=case_ids(SPLIT_CASES))
def test_split_heads_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    _, shape, heads = case
    x = inputs.randn(*shape)
    got, call = run(submission, "split_heads", x, heads)
    expect_close(got, reference.split_heads(x, heads), call, lookalikes=bugs.split_heads(x, heads))


@exercise("split_heads")
@pytest.mark.parametrize("case", SPLIT_CASES[:3], ids=case_ids(SPLIT_CASES[:3]))
def test_split_heads_gives_each_head_its_slice(submission, bugs, inputs, case):
    """head h holds features h*d to (h+1)*d of every token"""
    _, shape, heads = case
    x = inputs.randn(*shape)
    got, call = run(submission, "split_heads", x, heads)
    expect_close(got, oracles.split_heads(x, heads), call, lookalikes=bugs.split_heads(x, heads),
                 reference="a stack of the heads' feature slices")


@exercise("split_heads")
def test_split_heads_with_one_head_adds_an_axis(submission, inputs):
    """with one head, only adds a heads axis of size 1"""
    x = inputs.randn(2, 5, 6, dtype=torch.float64)
    got, call = run(submission, "split_heads", x, 1)
    expect_close(got, x.unsqueeze(-3), call, reference="x.unsqueeze(-3)")


@exercise("split_heads")
def test_split_heads_refuses_indivisible_width(submission, inputs):
    """raises ValueError when D is not divisible by num_heads"""
    expect_raises(submission, "split_heads", (inputs.randn(2, 5, 6), 4), {}, ("ValueError",),
                  "6 features do not split into 4 heads")


# -- merge_heads -------------------------------------------------------------------------

# (id, x shape): no batch dimension, one, two; one head; head width 1; odd T.
MERGE_CASES = [
    ("H2-T5-d3", (2, 5, 3)),
    ("B2-H4-T5-d2", (2, 4, 5, 2)),
    ("B2x3-H3-T4-d4", (2, 3, 3, 4, 4)),
    ("B2-H1-T7-d6", (2, 1, 7, 6)),
    ("B3-H5-T4-d1", (3, 5, 4, 1)),
]


@exercise("merge_heads")
@pytest.mark.parametrize("case", MERGE_CASES, ids=case_ids(MERGE_CASES))
def test_merge_heads_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    x = inputs.randn(*case[1])
    got, call = run(submission, "merge_heads", x)
    expect_close(got, reference.merge_heads(x), call, lookalikes=bugs.merge_heads(x))


@exercise("merge_heads")
@pytest.mark.parametrize("case", MERGE_CASES[:3], ids=case_ids(MERGE_CASES[:3]))
def test_merge_heads_concatenates_the_heads(submission, bugs, inputs, case):
    """puts head h in features h*d to (h+1)*d of every token"""
    x = inputs.randn(*case[1])
    got, call = run(submission, "merge_heads", x)
    expect_close(got, oracles.merge_heads(x), call, lookalikes=bugs.merge_heads(x),
                 reference="torch.cat(x.unbind(-3), dim=-1)")


@exercise("merge_heads")
@pytest.mark.parametrize("heads", [2, 3, 6], ids=["H2", "H3", "H6"])
def test_merge_heads_undoes_split(submission, bugs, inputs, heads):
    """undoes split_heads: merge_heads(split_heads(x)) == x"""
    x = inputs.randn(2, 5, 12, dtype=torch.float64)
    split = oracles.split_heads(x, heads)  # (2, H, 5, 12 // H), split here, not by your split_heads
    got, call = run(submission, "merge_heads", split)
    expect_close(got, x, f"{call} of x split into {heads} heads", lookalikes=bugs.merge_heads(split),
                 reference="the x before the split")


# -- multi_head_attention ------------------------------------------------------------------

# (id, query shape, key shape, value shape, H, D, D_v, d_out). D and D_v are the
# query/key and value widths of all heads together, d_out the output's width.
MHA_CASES = [
    ("L5-d8-H2", (5, 8), (5, 8), (5, 8), 2, 8, 8, 8),
    ("B2-L5-S7-H2-kin6-vin4", (2, 5, 8), (2, 7, 6), (2, 7, 4), 2, 8, 8, 8),
    ("B2x3-L4-S3-H4-Dv12-out5", (2, 3, 4, 6), (2, 3, 3, 6), (2, 3, 3, 6), 4, 8, 12, 5),
    ("B2-L6-S6-H1", (2, 6, 8), (2, 6, 8), (2, 6, 8), 1, 8, 8, 8),
    ("B1-L3-S5-H8-d1", (1, 3, 8), (1, 5, 8), (1, 5, 8), 8, 8, 8, 8),
]


def _mha_inputs(inputs, case, dtype=torch.float32):
    """``(query, key, value, H, w_q, w_k, w_v, w_o)`` for a case of MHA_CASES."""
    _, q_shape, k_shape, v_shape, heads, width, value_width, out_width = case
    query, key, value = (inputs.randn(*shape, dtype=dtype) for shape in (q_shape, k_shape, v_shape))
    w_q = _weight(inputs, width, q_shape[-1], dtype)
    w_k = _weight(inputs, width, k_shape[-1], dtype)
    w_v = _weight(inputs, value_width, v_shape[-1], dtype)
    w_o = _weight(inputs, out_width, value_width, dtype)
    return query, key, value, heads, w_q, w_k, w_v, w_o


@exercise("multi_head_attention")
@pytest.mark.parametrize("case", MHA_CASES, ids=case_ids(MHA_CASES))
def test_multi_head_attention_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    args = _mha_inputs(inputs, case)
    got, call = run(submission, "multi_head_attention", *args)
    expect_close(got, reference.multi_head_attention(*args), call,
                 lookalikes=bugs.multi_head_attention(*args))


@exercise("multi_head_attention")
@pytest.mark.parametrize("case", MHA_CASES[1:3], ids=case_ids(MHA_CASES[1:3]))
def test_multi_head_attention_matches_head_loop(submission, bugs, inputs, case):
    """matches F.scaled_dot_product_attention run head by head"""
    args = _mha_inputs(inputs, case)
    got, call = run(submission, "multi_head_attention", *args)
    expect_close(got, oracles.head_loop(*args), call, lookalikes=bugs.multi_head_attention(*args),
                 reference="a loop over heads with F.scaled_dot_product_attention")


@exercise("multi_head_attention")
@pytest.mark.parametrize("kind", ["L-S", "B-1-L-S", "B-H-L-S"])
def test_multi_head_attention_with_mask(submission, reference, bugs, inputs, kind):
    """with a mask, matches a loop over heads with F.scaled_dot_product_attention"""
    args = _mha_inputs(inputs, MHA_CASES[1])  # B=2, L=5, S=7, H=2
    shape = {"L-S": (5, 7), "B-1-L-S": (2, 1, 5, 7), "B-H-L-S": (2, 2, 5, 7)}[kind]
    mask = inputs.mask(*shape)
    got, call = run(submission, "multi_head_attention", *args, mask=mask)
    what = f"{call} (mask {kind}, True = may attend)"
    lookalikes = bugs.multi_head_attention(*args, mask=mask)
    expect_close(got, reference.multi_head_attention(*args, mask=mask), what, lookalikes=lookalikes)
    expect_close(got, oracles.head_loop(*args, mask=mask), what, lookalikes=lookalikes,
                 reference="a loop over heads with F.scaled_dot_product_attention")


@exercise("multi_head_attention")
@pytest.mark.parametrize("kind", ["self", "cross-kdim-vdim", "masked"])
def test_multi_head_attention_matches_pytorch_module(submission, bugs, inputs, kind):
    """matches nn.MultiheadAttention holding the same weights"""
    width, heads = 8, 2
    key_width, value_width = (6, 4) if kind == "cross-kdim-vdim" else (width, width)
    length, keys = (5, 7) if kind == "cross-kdim-vdim" else (6, 6)
    query = inputs.randn(3, length, width)
    key, value = inputs.randn(3, keys, key_width), inputs.randn(3, keys, value_width)
    if kind == "self":
        key = value = query
    state = {"q.weight": _weight(inputs, width, width), "k.weight": _weight(inputs, width, key_width),
             "v.weight": _weight(inputs, width, value_width), "out.weight": _weight(inputs, width, width)}
    mask = inputs.mask(3, heads, length, keys) if kind == "masked" else None
    args = (query, key, value, heads, state["q.weight"], state["k.weight"], state["v.weight"],
            state["out.weight"])
    got, call = run(submission, "multi_head_attention", *args, mask=mask)
    expected = oracles.pytorch_multi_head_attention(state, heads, query, key, value, mask)
    expect_close(got, expected, call, lookalikes=bugs.multi_head_attention(*args, mask=mask),
                 reference="nn.MultiheadAttention")


@exercise("multi_head_attention")
def test_multi_head_attention_with_one_head_is_attention(submission, inputs):
    """with one head, is single-head attention followed by w_o"""
    query, key, value, _, w_q, w_k, w_v, w_o = _mha_inputs(inputs, MHA_CASES[1])
    got, call = run(submission, "multi_head_attention", query, key, value, 1, w_q, w_k, w_v, w_o)
    expect_close(got, oracles.one_head_attention(query, key, value, w_q, w_k, w_v, w_o), call,
                 reference="F.scaled_dot_product_attention with the full width, then w_o")


@exercise("multi_head_attention")
def test_multi_head_attention_ignores_head_order(submission, inputs):
    """renumbering the heads (and w_o's columns to match) leaves the output unchanged"""
    query, key, value, heads, w_q, w_k, w_v, w_o = _mha_inputs(inputs, MHA_CASES[2])  # H=4
    order = torch.tensor([2, 0, 3, 1])

    def by_head(w: torch.Tensor, dim: int) -> torch.Tensor:  # reorder the heads' blocks along dim
        blocks = w.chunk(heads, dim=dim)
        return torch.cat([blocks[h] for h in order.tolist()], dim=dim)

    plain, call = run(submission, "multi_head_attention", query, key, value, heads, w_q, w_k, w_v, w_o)
    renumbered, _ = run(submission, "multi_head_attention", query, key, value, heads, by_head(w_q, 0),
                        by_head(w_k, 0), by_head(w_v, 0), by_head(w_o, 1))
    expect_like(plain, torch.empty(2, 3, 4, 5), call)
    expect_finite(plain, call, nan_only=True)
    expect_close(renumbered, plain, f"{call} with the heads renumbered",
                 reference="your output with the heads in their first order")


@exercise("multi_head_attention")
def test_multi_head_attention_fully_masked_query_gives_zeros(submission, bugs, inputs):
    """a query whose keys are all masked gets a zero output"""
    args = _mha_inputs(inputs, MHA_CASES[1])
    mask = inputs.mask(2, 1, 5, 7)
    mask[0, :, 3] = False
    got, call = run(submission, "multi_head_attention", *args, mask=mask)
    expect_close(got, oracles.head_loop(*args, mask=mask), f"{call} where query [0, 3] may attend to no key",
                 lookalikes=bugs.multi_head_attention(*args, mask=mask),
                 reference="a loop over heads with F.scaled_dot_product_attention")


@exercise("multi_head_attention")
def test_multi_head_attention_gradients(submission, inputs):
    """has the gradients of PyTorch's attention (autograd, float64)"""
    query, key, value, heads, *weights = _mha_inputs(inputs, MHA_CASES[2], dtype=torch.float64)
    mask = inputs.mask(4, 3)
    upstream = inputs.randn(2, 3, 4, 5, dtype=torch.float64)
    (got, grads), call = run_with_gradients(submission, "multi_head_attention",
                                            [query, key, value, heads, *weights], {"mask": mask},
                                            [0, 1, 2, 4, 5, 6, 7], None, upstream)
    expect_close(got, oracles.head_loop(query, key, value, heads, *weights, mask=mask), call,
                 reference="PyTorch")
    expected = oracles.head_loop_gradients(query, key, value, heads, *weights, mask, upstream)
    expect_gradients(grads, expected, ("query", "key", "value", "w_q", "w_k", "w_v", "w_o"), call)


# -- MultiHeadAttention ----------------------------------------------------------------------

# (id, x shape, d_model, H): no batch dimension, one, two; one head; head width 1.
MODULE_CASES = [
    ("T5-D8-H2", (5, 8), 8, 2),
    ("B2-T6-D8-H2", (2, 6, 8), 8, 2),
    ("B2x2-T5-D12-H3", (2, 2, 5, 12), 12, 3),
    ("B2-T4-D6-H1", (2, 4, 6), 6, 1),
    ("B1-T7-D4-H4-d1", (1, 7, 4), 4, 4),
]


def _module_state(inputs, d_model: int, bias: bool = True) -> dict:
    """Parameters in the course's names; biases random and far from zero."""
    state = {"qkv.weight": _weight(inputs, 3 * d_model, d_model),
             "out.weight": _weight(inputs, d_model, d_model)}
    if bias:
        state["qkv.bias"] = inputs.randn(3 * d_model) * 0.5
        state["out.bias"] = inputs.randn(d_model) * 0.5
    return state


def _recipe(state: dict, d_model: int, heads: int, **options) -> ModuleCall:
    init = {"d_model": d_model, "num_heads": heads}
    if "qkv.bias" not in state:
        init["bias"] = False
    if "dropout" in options:
        init["dropout"] = options.pop("dropout")
    return ModuleCall(init_kwargs=init, state=state, **options)


@exercise("MultiHeadAttention")
@pytest.mark.parametrize("case", MODULE_CASES, ids=case_ids(MODULE_CASES))
def test_module_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    _, shape, width, heads = case
    x = inputs.randn(*shape)
    recipe = _recipe(_module_state(inputs, width), width, heads)
    expect_module_matches_reference(submission, reference, bugs, "MultiHeadAttention", recipe, x)


@exercise("MultiHeadAttention")
@pytest.mark.parametrize("kind", ["bias", "no-bias", "causal-mask", "unbatched", "H4"])
def test_module_matches_pytorch(submission, bugs, inputs, kind):
    """loaded with nn.MultiheadAttention's weights, gives its output"""
    width, heads = 8, 4 if kind == "H4" else 2
    x = inputs.randn(5, width) if kind == "unbatched" else inputs.randn(3, 5, width)
    state = _module_state(inputs, width, bias=kind != "no-bias")
    mask = torch.ones(5, 5, dtype=torch.bool).tril() if kind == "causal-mask" else None
    recipe = _recipe(state, width, heads)
    got, call = run_module(submission, "MultiHeadAttention", recipe, x, mask=mask)
    expected, _ = oracles.module_attention(state, heads, x, mask)
    expect_close(got, expected, f"{call} ({kind})", reference="nn.MultiheadAttention",
                 lookalikes=bugs.module("MultiHeadAttention", recipe, x, mask=mask))


@exercise("MultiHeadAttention")
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_module_weights_match_pytorch(submission, bugs, inputs, masked):
    """with need_weights=True, returns nn.MultiheadAttention's per-head weights"""
    width, heads = 12, 3
    x = inputs.randn(2, 5, width)
    state = _module_state(inputs, width)
    mask = inputs.mask(2, heads, 5, 5) if masked else None
    recipe = _recipe(state, width, heads)
    got, call = run_module(submission, "MultiHeadAttention", recipe, x, mask=mask, need_weights=True)
    expected = oracles.module_attention(state, heads, x, mask, need_weights=True)
    expect_attention(got, expected, call,
                     bugs.module("MultiHeadAttention", recipe, x, mask=mask, need_weights=True),
                     reference="nn.MultiheadAttention(average_attn_weights=False)")


@exercise("MultiHeadAttention")
@pytest.mark.parametrize("kind", ["T-T", "B-1-T-T", "B-H-T-T"])
def test_module_with_mask_matches_reference(submission, reference, bugs, inputs, kind):
    """with a mask, matches the reference"""
    width, heads = 8, 2
    x = inputs.randn(2, 6, width)
    shape = {"T-T": (6, 6), "B-1-T-T": (2, 1, 6, 6), "B-H-T-T": (2, heads, 6, 6)}[kind]
    mask = inputs.mask(*shape)
    recipe = _recipe(_module_state(inputs, width), width, heads)
    got, call = run_module(submission, "MultiHeadAttention", recipe, x, mask=mask, need_weights=True)
    expect_attention(got, reference_module_call(reference, "MultiHeadAttention", recipe, x, mask=mask,
                                                need_weights=True),
                     f"{call} (mask {kind}, True = may attend)",
                     bugs.module("MultiHeadAttention", recipe, x, mask=mask, need_weights=True))


@exercise("MultiHeadAttention")
def test_module_fully_masked_query_gets_zero_weights(submission, reference, bugs, inputs):
    """a query whose keys are all masked gets zero weights, not NaN"""
    # nn.MultiheadAttention gives NaN here, so the reference is the oracle;
    # that query's output is then out(0), the output projection's bias.
    width, heads = 8, 2
    x = inputs.randn(2, 6, width)
    mask = inputs.mask(2, 1, 6, 6)
    mask[1, :, 2] = False
    recipe = _recipe(_module_state(inputs, width), width, heads)
    got, call = run_module(submission, "MultiHeadAttention", recipe, x, mask=mask, need_weights=True)
    expect_attention(got, reference_module_call(reference, "MultiHeadAttention", recipe, x, mask=mask,
                                                need_weights=True),
                     f"{call} where query [1, 2] may attend to no key",
                     bugs.module("MultiHeadAttention", recipe, x, mask=mask, need_weights=True))


@exercise("MultiHeadAttention")
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_module_parameters(submission, inputs, bias):
    """has the parameters qkv (Linear(D, 3D)) and out (Linear(D, D)), biases only with bias=True"""
    width, heads = 8, 2
    x = inputs.randn(2, 3, width)
    recipe = ModuleCall(init_kwargs={"d_model": width, "num_heads": heads, "bias": bias}, return_state=True)
    got, call = run_module(submission, "MultiHeadAttention", recipe, x)
    _, state = unpack(got, ("output", "state"), call)
    expected = {"qkv.weight": (3 * width, width), "out.weight": (width, width)}
    if bias:
        expected.update({"qkv.bias": (3 * width,), "out.bias": (width,)})
    if not isinstance(state, dict):
        fail(f"{call}: could not read the module's state_dict")

    def listing(shapes: dict) -> str:
        return ", ".join(f"{name} {tuple(shape)}" for name, shape in sorted(shapes.items()))

    found = {name: tuple(value.shape) for name, value in state.items() if hasattr(value, "shape")}
    expect_true(found == expected, f"{recipe.text('MultiHeadAttention')} has parameters "
                f"{listing(found) or 'none'}; expected {listing(expected)}")


@exercise("MultiHeadAttention")
def test_module_eval_ignores_dropout(submission, reference, bugs, inputs):
    """in eval mode, dropout changes nothing"""
    width, heads = 8, 2
    x = inputs.randn(2, 6, width)
    state = _module_state(inputs, width)
    recipe = _recipe(state, width, heads, dropout=0.5, seed=11)
    got, call = run_module(submission, "MultiHeadAttention", recipe, x, need_weights=True)
    expected = reference_module_call(reference, "MultiHeadAttention", _recipe(state, width, heads), x,
                                     need_weights=True)
    expect_attention(got, expected, f"{call} in eval mode",
                     bugs.module("MultiHeadAttention", recipe, x, need_weights=True),
                     reference="the same module with dropout=0.0")


def _training_call(submission, inputs):
    """Run the module in training mode with dropout 0.5; what the checks below need."""
    width, heads, p = 8, 2, 0.5
    x = inputs.randn(2, 6, width)
    state = _module_state(inputs, width)
    seed = int(torch.randint(2**31 - 1, (), generator=inputs.generator))
    recipe = _recipe(state, width, heads, dropout=p, train=True, seed=seed)
    got, call = run_module(submission, "MultiHeadAttention", recipe, x, need_weights=True)
    output, weights = unpack(got, ("output", "weights"), call)
    expect_like(weights, torch.empty(2, heads, 6, 6), f"weights of {call}")
    expect_like(output, x, f"output of {call}")
    return x, state, heads, p, recipe, output, weights, call


@exercise("MultiHeadAttention")
def test_module_dropout_drops_weights(submission, reference, bugs, inputs):
    """in training, zeroes some attention weights and scales the rest by 1/(1-p)"""
    x, state, heads, p, recipe, output, weights, call = _training_call(submission, inputs)
    eval_recipe = _recipe(state, x.shape[-1], heads)
    _, eval_weights = reference_module_call(reference, "MultiHeadAttention", eval_recipe, x,
                                            need_weights=True)
    kept = weights != 0
    expect_close(weights, torch.where(kept, eval_weights / (1 - p), 0.0),
                 f"weights of {call} (each weight must be 0 or its eval-mode value / (1 - p))",
                 lookalikes=bugs.module("MultiHeadAttention", recipe, x, need_weights=True).part(1, (output, weights)),
                 reference="the eval-mode weights / (1 - p) where yours are not 0")
    dropped = int((~kept).sum())
    expect_true(dropped > 0, f"{call} dropped no attention weight (p=0.5, {weights.numel()} weights)")
    expect_true(dropped < weights.numel(), f"{call} dropped every attention weight (p=0.5)")


@exercise("MultiHeadAttention")
def test_module_dropout_output_uses_returned_weights(submission, bugs, inputs):
    """in training, the output averages the values with the returned (dropped-out) weights"""
    x, state, heads, _, recipe, output, weights, call = _training_call(submission, inputs)
    # out(merge_heads(weights @ v)) = sum over heads of weights_h @ (v_h @ out_h^T), plus out's bias,
    # where out_h is head h's columns of out.weight; the oracle gives each v_h @ out_h^T.
    through_output = oracles.values_through_output(state, heads, x)  # (B, H, T, D)
    expected = (weights @ through_output).sum(dim=-3) + state["out.bias"]  # (B, T, D)
    expect_close(output, expected, f"output of {call}",
                 lookalikes=bugs.module("MultiHeadAttention", recipe, x, need_weights=True).part(0, (output, weights)),
                 reference="out(merge_heads(weights @ v)) recomputed with your returned weights")


@exercise("MultiHeadAttention")
def test_module_gradient(submission, inputs):
    """has the gradient of nn.MultiheadAttention with respect to x"""
    width, heads = 8, 2
    x = inputs.randn(2, 5, width)
    upstream = inputs.randn(2, 5, width)
    state = _module_state(inputs, width)
    recipe = _recipe(state, width, heads)
    grad = {"wrt": [0], "output": None, "grad_output": upstream}
    got, grads = submission.call("MultiHeadAttention", (x,), {}, grad=grad, module=recipe)
    call = submission.call_text("MultiHeadAttention", (x,), {}, module=recipe)
    expected = [oracles.module_gradient(state, heads, x, upstream)]
    expect_close(got, oracles.module_attention(state, heads, x)[0], call, reference="nn.MultiheadAttention")
    expect_gradients(grads, expected, ("x",), call, reference="nn.MultiheadAttention")


# -- torch_multihead_forward -------------------------------------------------------------------

# (id, L, S, N, E, H, batch_first): both layouts, L != S, one head, head width 1.
TORCH_CASES = [
    ("L5-N2-E8-H2-seq-first", 5, 5, 2, 8, 2, False),
    ("L5-N2-E8-H2-batch-first", 5, 5, 2, 8, 2, True),
    ("L4-S6-N3-E6-H3-seq-first", 4, 6, 3, 6, 3, False),
    ("L3-S7-N2-E4-H1-batch-first", 3, 7, 2, 4, 1, True),
    ("L6-S4-N3-E4-H4-d1-seq-first", 6, 4, 3, 4, 4, False),
]


def _torch_inputs(inputs, case, in_bias=True, out_bias=True):
    """``(query, key, value, H, in_proj_weight, in_proj_bias, out_proj_weight,
    out_proj_bias)`` and the course-named state of the same parameters."""
    _, length, keys, batch, width, heads, batch_first = case
    layout = (lambda n, t: (n, t, width)) if batch_first else (lambda n, t: (t, n, width))
    query = inputs.randn(*layout(batch, length))
    key, value = inputs.randn(*layout(batch, keys)), inputs.randn(*layout(batch, keys))
    state = {"qkv.weight": _weight(inputs, 3 * width, width), "out.weight": _weight(inputs, width, width),
             "qkv.bias": inputs.randn(3 * width) * 0.5 if in_bias else torch.zeros(3 * width),
             "out.bias": inputs.randn(width) * 0.5 if out_bias else torch.zeros(width)}
    args = (query, key, value, heads, state["qkv.weight"], state["qkv.bias"] if in_bias else None,
            state["out.weight"], state["out.bias"] if out_bias else None)
    return args, state


@exercise("torch_multihead_forward")
@pytest.mark.parametrize("case", TORCH_CASES, ids=case_ids(TORCH_CASES))
def test_torch_forward_matches_pytorch(submission, bugs, inputs, case):
    """gives nn.MultiheadAttention's output from its parameters"""
    batch_first = case[-1]
    args, state = _torch_inputs(inputs, case)
    got, call = run(submission, "torch_multihead_forward", *args, batch_first=batch_first)
    expect_close(got, oracles.torch_multihead_forward(state, *args[:4], batch_first), call,
                 lookalikes=bugs.torch_multihead_forward(*args, batch_first=batch_first),
                 reference="nn.MultiheadAttention")


@exercise("torch_multihead_forward")
@pytest.mark.parametrize("case", TORCH_CASES[:3], ids=case_ids(TORCH_CASES[:3]))
def test_torch_forward_with_key_padding_mask(submission, bugs, inputs, case):
    """with a key_padding_mask (True = ignore), gives nn.MultiheadAttention's output"""
    _, _, keys, batch, _, _, batch_first = case
    args, state = _torch_inputs(inputs, case)
    padding = ~inputs.mask(batch, keys, keep=0.5)  # True = ignore; each sequence keeps a key
    got, call = run(submission, "torch_multihead_forward", *args, key_padding_mask=padding,
                    batch_first=batch_first)
    expect_close(got, oracles.torch_multihead_forward(state, *args[:4], batch_first, padding), call,

                 lookalikes=bugs.torch_multihead_forward(*args, key_padding_mask=padding,
                                                         batch_first=batch_first),
                 reference="nn.MultiheadAttention")


@exercise("torch_multihead_forward")
@pytest.mark.parametrize("biases", ["none", "out-only"])
def test_torch_forward_without_in_proj_bias(submission, bugs, inputs, biases):
    """with in_proj_bias=None, gives nn.MultiheadAttention's output"""
    case = TORCH_CASES[2]
    args, state = _torch_inputs(inputs, case, in_bias=False, out_bias=biases == "out-only")
    if biases == "none":
        state = {"qkv.weight": state["qkv.weight"], "out.weight": state["out.weight"]}  # bias=False
    got, call = run(submission, "torch_multihead_forward", *args)
    expect_close(got, oracles.torch_multihead_forward(state, *args[:4], False), call,
                 lookalikes=bugs.torch_multihead_forward(*args), reference="nn.MultiheadAttention")


@exercise("torch_multihead_forward")
def test_torch_forward_layouts_agree(submission, reference, bugs, inputs):
    """batch_first=False gives the batch_first=True output, transposed"""
    case = ("L5-S3-N2-E6-H2", 5, 3, 2, 6, 2, True)
    args, _ = _torch_inputs(inputs, case)
    first, call_first = run(submission, "torch_multihead_forward", *args, batch_first=True)
    seq_args = (*(t.transpose(0, 1).contiguous() for t in args[:3]), *args[3:])
    seq, call_seq = run(submission, "torch_multihead_forward", *seq_args, batch_first=False)
    expect_close(first, reference.torch_multihead_forward(*args, batch_first=True), call_first,
                 lookalikes=bugs.torch_multihead_forward(*args, batch_first=True))
    expect_like(seq, first.transpose(0, 1), call_seq)
    expect_close(seq, first.transpose(0, 1), call_seq,
                 lookalikes=bugs.torch_multihead_forward(*seq_args, batch_first=False),
                 reference="your batch_first=True output, transposed to (L, N, E)")


# -- parameter_count -----------------------------------------------------------------------------

# (d_model, H, bias)
COUNT_CASES = [(8, 2, True), (8, 2, False), (12, 3, True), (6, 1, True), (16, 16, False), (10, 5, True)]


def _count_ids(cases):
    return [f"D{d}-H{h}-{'bias' if bias else 'no-bias'}" for d, h, bias in cases]


def _expect_count(got, expected: int, call: str, lookalikes, reference: str) -> None:
    """An int equal to ``expected``; a known bug's hint when it gives the same wrong number."""
    if type(got) is not int:  # the answer goes with the failure: a relation may name it (the count, as a float)
        raise CheckFailure(f"{call} returned {describe(got)}, expected an int", compared=Compared(got, expected))
    if got != expected:
        hint = next((hint for hint, wrong in lookalikes() if type(wrong) is int and wrong == got), None)
        raise CheckFailure(f"{call} returned {got}, expected {expected} ({reference})", hint=hint,
                           compared=None if hint else Compared(got, expected))


@exercise("parameter_count")
@pytest.mark.parametrize("d_model, heads, bias", COUNT_CASES, ids=_count_ids(COUNT_CASES))
def test_parameter_count_matches_pytorch(submission, bugs, d_model, heads, bias):
    """equals the number of parameters of nn.MultiheadAttention"""
    got, call = run(submission, "parameter_count", d_model, heads, bias=bias)
    expected = oracles.parameter_count(d_model, heads, bias)
    _expect_count(got, expected, call, bugs.parameter_count(d_model, heads, bias=bias),
                  "the parameters of nn.MultiheadAttention")


@exercise("parameter_count")
@pytest.mark.parametrize("d_model, heads, bias", COUNT_CASES[::2], ids=_count_ids(COUNT_CASES[::2]))
def test_parameter_count_matches_reference(submission, reference, bugs, d_model, heads, bias):
    """matches the reference"""
    got, call = run(submission, "parameter_count", d_model, heads, bias=bias)
    _expect_count(got, reference.parameter_count(d_model, heads, bias=bias), call,
                  bugs.parameter_count(d_model, heads, bias=bias), "the reference")


@exercise("parameter_count")
def test_parameter_count_does_not_depend_on_heads(submission, bugs):
    """does not depend on the number of heads"""
    one_head, call = run(submission, "parameter_count", 12, 1)
    for heads in (2, 3, 4, 6, 12):
        got, call = run(submission, "parameter_count", 12, heads)
        _expect_count(got, one_head, call, bugs.parameter_count(12, heads),
                      "your count for 1 head: heads split the projections, they add no parameters")


# A model too wide to build: its weights alone would be 4 x 10^12 numbers, 16 TB in float32.
# A formula answers at once; building a module to count fails to allocate, at once too.
WIDE_MODEL = (10**6, 8)


@exercise("parameter_count")
def test_parameter_count_builds_nothing(submission, bugs):
    """is a formula: builds no module nor tensor, and counts a model of d_model = 1,000,000 at once"""
    d_model, heads = WIDE_MODEL
    expected = oracles.parameter_count(d_model, heads, True)  # counted on the meta device
    try:
        got, call = run(submission, "parameter_count", d_model, heads)
    except CheckFailure as failure:
        if failure.kind not in (Failure.ERROR, Failure.MEMORY):
            raise
        fail(f"{failure.message}; a model this wide has {expected:,} parameters, more than memory holds: "
             "count them with a formula in d_model and bias, without building the module", failure.kind)
    _expect_count(got, expected, call, bugs.parameter_count(d_model, heads),
                  "the parameters of nn.MultiheadAttention, counted on the meta device")
    for d_model, heads, bias in [(8, 2, True), (8, 2, False), (*WIDE_MODEL, True)]:
        call = submission.call_text("parameter_count", (d_model, heads), {"bias": bias})
        try:
            largest = run_measured(submission, "parameter_count", d_model, heads, bias=bias)[1].largest
        except PartlyMeasured as measured:
            largest = measured.largest  # None: no tensor made, arithmetic on ints
        if largest is not None:
            fail(f"{call} made a {shape_text(largest.shape)} tensor ({largest.numel:,} numbers); the count "
                 "is arithmetic on d_model and bias (four D x D weights and, with bias=True, four biases "
                 "of D), not the parameters of a module built to be counted (on the meta device too)")


# -- every exercise -----------------------------------------------------------------------

# A tensor made without device= stays on the CPU on a GPU machine; the
# worker's device tracking shows where, on any machine.
test_would_run_on_a_gpu = portability_check([
    portable("split_heads", lambda inputs: ((inputs.randn(2, 5, 8), 2), {})),
    portable("merge_heads", lambda inputs: ((inputs.randn(2, 2, 5, 4),), {})),
    portable("multi_head_attention", lambda inputs: (
        _mha_inputs(inputs, MHA_CASES[1]), {"mask": inputs.mask(5, 7)})),
    portable("MultiHeadAttention", lambda inputs: (
        (inputs.randn(2, 5, 8),),
        {"mask": inputs.mask(5, 5), "need_weights": True,
         "module": _recipe(_module_state(inputs, 8), 8, 2)})),
    portable("torch_multihead_forward", lambda inputs: (
        _torch_inputs(inputs, TORCH_CASES[1])[0],
        {"key_padding_mask": ~inputs.mask(2, 5), "batch_first": True})),
])
