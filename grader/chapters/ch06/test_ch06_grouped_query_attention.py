"""Hidden checks for chapter 6: grouped-query and multi-query attention.

Every exercise is checked against the reference on several shapes (groups of
one, two, three and four query heads; one K/V head; L != S; d_v != d; one
query), against independent oracles (a loop over query heads with
``F.scaled_dot_product_attention``, the same function with
``enable_gqa=True``, ``nn.MultiheadAttention`` when every query head has its
own K/V head, the KV-cache formula written out), against properties (which K/V head each query head uses, the cache
shrinking by H_q / H_kv, gradients in float64) and, on a mismatch, against
known wrong implementations, whose hint then goes with the failure.

The head-order checks name the K/V head each query head actually used:
``repeat`` instead of ``repeat_interleave`` gives query head 1 of a group of
two K/V head 1 instead of 0, and the message says so.
"""

import pytest
import torch

from grader.checks import (
    case_ids,
    exercise,
    expect_int,
    expect_attention,
    expect_gradients,
    expect_module_matches_reference,
    expect_raises,
    Oracles,
    portability_check,
    portable,
    reference_module_call,
    run,
    run_module,
    run_with_gradients,
)
from grader.compare import (
    expect_close,
    expect_like,
    expect_true,
    fail,
    matches,
    matching_hint,
    unpack,
)
from grader.module_calls import ModuleCall

# A loop over query heads, PyTorch's own GQA and MHA (oracles.py).
oracles = Oracles("ch06")

def _groups_text(num_query_heads: int, num_kv_heads: int) -> str:
    group = num_query_heads // num_kv_heads
    return (f"{num_query_heads} query heads share {num_kv_heads} K/V heads in groups of {group}: "
            f"query heads 0 to {num_query_heads - 1} read K/V heads "
            f"{', '.join(str(h // group) for h in range(num_query_heads))}")


def _expect_head_order(got: torch.Tensor, candidates, num_kv_heads: int, what: str,
                       lookalikes=None) -> bool:
    """Which K/V head each query head of ``got`` (heads on dim 1) used.

    ``candidates(h, j)`` is what query head ``h`` gives with K/V head ``j``.
    Fails naming the first query head that used another K/V head than
    ``h // group``; returns False when some head matches no K/V head at all
    (the caller then compares the values and says how they differ).
    """
    num_query_heads = got.shape[1]
    group = num_query_heads // num_kv_heads
    for h in range(num_query_heads):
        used = [j for j in range(num_kv_heads) if matches(got[:, h], candidates(h, j))]
        if not used:
            return False
        if h // group not in used:
            fail(f"{what}: query head {h} uses K/V head {used[0]}; expected K/V head {h // group} "
                 f"= {h} // {group} ({_groups_text(num_query_heads, num_kv_heads)})",
                 hint=matching_hint(got, lookalikes) if lookalikes else None)
    return True


# -- expand_kv_heads ---------------------------------------------------------------------

# (id, kv shape (B, H_kv, S, d), H_q): groups of 2, 3 and 4, one K/V head, groups of one,
# one token, width 1.
EXPAND_CASES = [
    ("B2-Hkv2-Hq4-S5-d3", (2, 2, 5, 3), 4),
    ("B1-Hkv3-Hq6-S4-d4", (1, 3, 4, 4), 6),
    ("B2-Hkv2-Hq8-S3-d2", (2, 2, 3, 2), 8),
    ("B3-Hkv1-Hq4-S5-d4-MQA", (3, 1, 5, 4), 4),
    ("B2-Hkv3-Hq3-S6-d2-MHA", (2, 3, 6, 2), 3),
    ("B2-Hkv4-Hq8-S1-d1", (2, 4, 1, 1), 8),
]
GROUPED = [case for case in EXPAND_CASES if 1 < case[1][1] < case[2]]  # more than one K/V head and group


@exercise("expand_kv_heads")
@pytest.mark.parametrize("case", EXPAND_CASES, ids=case_ids(EXPAND_CASES))
def test_expand_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    _, shape, num_query_heads = case
    kv = inputs.randn(*shape)
    got, call = run(submission, "expand_kv_heads", kv, num_query_heads)
    expect_close(got, reference.expand_kv_heads(kv, num_query_heads), call,
                 lookalikes=bugs.expand_kv_heads(kv, num_query_heads))


@exercise("expand_kv_heads")
@pytest.mark.parametrize("case", GROUPED, ids=case_ids(GROUPED))
def test_expand_gives_query_head_h_kv_head_h_over_group(submission, bugs, inputs, case):
    """head h of the result is K/V head h // group: each K/V head repeated in place (0, 0, 1, 1)"""
    _, shape, num_query_heads = case
    kv = inputs.randn(*shape)
    got, call = run(submission, "expand_kv_heads", kv, num_query_heads)
    lookalikes = bugs.expand_kv_heads(kv, num_query_heads)
    expected = oracles.expand_by_index(kv, num_query_heads)  # (B, H_q, S, d)
    expect_like(got, expected, call)
    if not _expect_head_order(got, lambda h, j: kv[:, j], shape[1], call, lookalikes):
        expect_close(got, expected, call, lookalikes=lookalikes, reference="kv[:, h // group] for every h")


@exercise("expand_kv_heads")
def test_expand_with_groups_of_one_changes_nothing(submission, inputs):
    """with H_q == H_kv (multi-head attention), returns the heads as they are"""
    kv = inputs.randn(2, 4, 5, 3, dtype=torch.float64)
    got, call = run(submission, "expand_kv_heads", kv, 4)
    expect_close(got, kv, call, reference="kv itself (every group holds one query head)")


@exercise("expand_kv_heads")
def test_expand_one_kv_head_serves_every_query_head(submission, bugs, inputs):
    """with one K/V head (multi-query attention), every query head gets it"""
    kv = inputs.randn(2, 1, 5, 3)
    got, call = run(submission, "expand_kv_heads", kv, 6)
    expect_close(got, kv.expand(2, 6, 5, 3), call, lookalikes=bugs.expand_kv_heads(kv, 6),
                 reference="the one K/V head, six times")


UNEVEN_GROUPS = "6 query heads cannot be shared out evenly among 4 K/V heads"


@exercise("expand_kv_heads")
def test_expand_refuses_query_heads_not_a_multiple(submission, bugs, inputs):
    """raises ValueError when H_q is not a multiple of H_kv"""
    kv = inputs.randn(2, 4, 5, 3)
    expect_raises(submission, "expand_kv_heads", (kv, 6), {}, ("ValueError",), UNEVEN_GROUPS,
                  lookalikes=bugs.expand_kv_heads(kv, 6))


# -- grouped_query_attention --------------------------------------------------------------

# (id, B, H_q, H_kv, L, S, d, d_v)
GQA_CASES = [
    ("B2-Hq4-Hkv2-L5-S7-d8", 2, 4, 2, 5, 7, 8, 8),
    ("B1-Hq6-Hkv3-L4-S4-d4-dv6", 1, 6, 3, 4, 4, 4, 6),
    ("B2-Hq8-Hkv2-L3-S6-d2", 2, 8, 2, 3, 6, 2, 2),
    ("B3-Hq4-Hkv1-L5-S3-d4-MQA", 3, 4, 1, 5, 3, 4, 4),
    ("B2-Hq3-Hkv3-L6-S5-d4-MHA", 2, 3, 3, 6, 5, 4, 4),
    ("B2-Hq6-Hkv2-L1-S8-d1-dv3", 2, 6, 2, 1, 8, 1, 3),
]
GQA_GROUPED = [case for case in GQA_CASES if 1 < case[3] < case[2]]


def _gqa_inputs(inputs, case, dtype=torch.float32):
    """``(q, k, v)`` for a case of GQA_CASES."""
    _, batch, num_query_heads, num_kv_heads, length, keys, width, value_width = case
    return (inputs.randn(batch, num_query_heads, length, width, dtype=dtype),
            inputs.randn(batch, num_kv_heads, keys, width, dtype=dtype),
            inputs.randn(batch, num_kv_heads, keys, value_width, dtype=dtype))


@exercise("grouped_query_attention")
@pytest.mark.parametrize("case", GQA_CASES, ids=case_ids(GQA_CASES))
def test_gqa_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference: output and weights"""
    q, k, v = _gqa_inputs(inputs, case)
    got, call = run(submission, "grouped_query_attention", q, k, v)
    expect_attention(got, reference.grouped_query_attention(q, k, v), call,
                     bugs.grouped_query_attention(q, k, v))


@exercise("grouped_query_attention")
@pytest.mark.parametrize("case", GQA_CASES[:4], ids=case_ids(GQA_CASES[:4]))
def test_gqa_matches_pytorch_enable_gqa(submission, bugs, inputs, case):
    """matches F.scaled_dot_product_attention(q, k, v, enable_gqa=True)"""
    q, k, v = _gqa_inputs(inputs, case)
    got, call = run(submission, "grouped_query_attention", q, k, v)
    output, _ = unpack(got, ("output", "weights"), call)
    expected = oracles.enable_gqa_attention(q, k, v)
    expect_close(output, expected, f"output of {call}",
                 lookalikes=bugs.grouped_query_attention(q, k, v).part(0, got),
                 reference="F.scaled_dot_product_attention(..., enable_gqa=True)")


@exercise("grouped_query_attention")
@pytest.mark.parametrize("case", GQA_GROUPED, ids=case_ids(GQA_GROUPED))
def test_gqa_query_head_uses_kv_head_h_over_group(submission, bugs, inputs, case):
    """query head h attends with K/V head h // group (the heads of a group are side by side)"""
    q, k, v = _gqa_inputs(inputs, case)
    got, call = run(submission, "grouped_query_attention", q, k, v)
    lookalikes = bugs.grouped_query_attention(q, k, v)
    output, weights = unpack(got, ("output", "weights"), call)
    expected_output, expected_weights = oracles.head_loop(q, k, v)
    # Query head h with K/V head j, for every h and j: (B, H_q, H_kv, L, d_v) and (B, H_q, H_kv, L, S).
    pair_outputs, pair_weights = oracles.head_with_each_kv_head(q, k, v)
    expect_like(weights, expected_weights, f"weights of {call}")
    if not _expect_head_order(weights, lambda h, j: pair_weights[:, h, j], k.shape[1],
                              f"weights of {call}", lookalikes.part(1, got)):
        expect_close(weights, expected_weights, f"weights of {call}", lookalikes=lookalikes.part(1, got),
                     reference="a loop over query heads, head h with K/V head h // group")
    expect_like(output, expected_output, f"output of {call}")
    if not _expect_head_order(output, lambda h, j: pair_outputs[:, h, j], k.shape[1],
                              f"output of {call}", lookalikes.part(0, got)):
        expect_close(output, expected_output, f"output of {call}", lookalikes=lookalikes.part(0, got),
                     reference="a loop over query heads, head h with K/V head h // group")


@exercise("grouped_query_attention")
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_gqa_with_groups_of_one_is_multi_head_attention(submission, bugs, inputs, masked):
    """with H_kv == H_q, is multi-head attention: F.scaled_dot_product_attention on every head"""
    q, k, v = _gqa_inputs(inputs, ("B2-Hq4-Hkv4-L5-S6-d4", 2, 4, 4, 5, 6, 4, 4))
    mask = inputs.mask(2, 4, 5, 6) if masked else None
    got, call = run(submission, "grouped_query_attention", q, k, v, mask=mask)
    expected = oracles.attention(q, k, v, mask)  # no grouping at all: head h with K/V head h
    expect_attention(got, expected, call, bugs.grouped_query_attention(q, k, v, mask=mask),
                     reference="F.scaled_dot_product_attention")


@exercise("grouped_query_attention")
def test_gqa_with_one_kv_head_is_multi_query_attention(submission, bugs, inputs):
    """with one K/V head (multi-query attention), every query head attends to it"""
    q, k, v = _gqa_inputs(inputs, GQA_CASES[3])  # H_q = 4, H_kv = 1
    got, call = run(submission, "grouped_query_attention", q, k, v)
    shared = [t.expand(-1, q.shape[1], -1, -1) for t in (k, v)]  # the one head, seen by every query head
    expect_attention(got, oracles.attention(q, *shared), call, bugs.grouped_query_attention(q, k, v),
                     reference="F.scaled_dot_product_attention with the one K/V head for every query head")


# Masks of every shape the docstring allows; (B, H_q, L, S) differs within a group.
MASK_KINDS = {"L-S": (5, 7), "B-1-L-S": (2, 1, 5, 7), "B-Hq-L-S": (2, 4, 5, 7), "B-1-1-S": (2, 1, 1, 7)}


@exercise("grouped_query_attention")
@pytest.mark.parametrize("kind", list(MASK_KINDS))
def test_gqa_with_mask(submission, reference, bugs, inputs, kind):
    """with a mask broadcast over the query heads, matches the reference and a loop over query heads"""
    q, k, v = _gqa_inputs(inputs, GQA_CASES[0])  # B=2, H_q=4, H_kv=2, L=5, S=7
    mask = inputs.mask(*MASK_KINDS[kind])
    got, call = run(submission, "grouped_query_attention", q, k, v, mask=mask)
    what = f"{call} (mask {kind}, True = may attend)"
    lookalikes = bugs.grouped_query_attention(q, k, v, mask=mask)
    expect_attention(got, reference.grouped_query_attention(q, k, v, mask=mask), what, lookalikes)
    expect_attention(got, oracles.head_loop(q, k, v, mask), what, lookalikes,
                     reference="a loop over query heads with F.scaled_dot_product_attention")


@exercise("grouped_query_attention")
def test_gqa_fully_masked_query_gets_zeros(submission, bugs, inputs):
    """a query whose keys are all masked gets zero weights and a zero output"""
    q, k, v = _gqa_inputs(inputs, GQA_CASES[0])
    mask = inputs.mask(2, 4, 5, 7)
    mask[1, 3, 2] = False  # query 2 of query head 3 (group 1) of sequence 1
    got, call = run(submission, "grouped_query_attention", q, k, v, mask=mask)
    expect_attention(got, oracles.head_loop(q, k, v, mask), f"{call} where query [1, 3, 2] may attend to no key",
                     bugs.grouped_query_attention(q, k, v, mask=mask),
                     reference="F.scaled_dot_product_attention (zeros for that query)")


@exercise("grouped_query_attention")
def test_gqa_gradients(submission, inputs):
    """has the gradients of PyTorch's attention (autograd, float64): a K/V head sums its group's"""
    q, k, v = _gqa_inputs(inputs, ("B2-Hq6-Hkv2-L4-S5-d3-dv2", 2, 6, 2, 4, 5, 3, 2), dtype=torch.float64)
    mask = inputs.mask(2, 1, 4, 5)
    upstream = inputs.randn(2, 6, 4, 2, dtype=torch.float64)
    (got, grads), call = run_with_gradients(submission, "grouped_query_attention", [q, k, v],
                                            {"mask": mask}, [0, 1, 2], 0, upstream)
    output, _ = unpack(got, ("output", "weights"), call)
    expect_close(output, oracles.head_loop(q, k, v, mask)[0], f"output of {call}", reference="PyTorch")
    expected = oracles.head_loop_gradients(q, k, v, mask, upstream)
    expect_gradients(grads, expected, ("q", "k", "v"), call)


# -- GroupedQueryAttention -----------------------------------------------------------------

# (id, B, T, D, H_q, H_kv, bias)
MODULE_CASES = [
    ("B2-T5-D8-Hq4-Hkv2", 2, 5, 8, 4, 2, False),
    ("B2-T6-D12-Hq6-Hkv3-bias", 2, 6, 12, 6, 3, True),
    ("B1-T7-D8-Hq4-Hkv1-MQA", 1, 7, 8, 4, 1, False),
    ("B3-T4-D8-Hq2-Hkv2-MHA-bias", 3, 4, 8, 2, 2, True),
    ("B2-T5-D16-Hq8-Hkv2-d2", 2, 5, 16, 8, 2, False),
    ("B2-T1-D8-Hq4-Hkv2-one-token-bias", 2, 1, 8, 4, 2, True),
]


def _weight(inputs, d_out: int, d_in: int) -> torch.Tensor:
    """A random (d_out, d_in) weight scaled like nn.Linear's, so softmaxes stay soft."""
    return inputs.randn(d_out, d_in) / d_in ** 0.5


def _module_state(inputs, d_model: int, num_heads: int, num_kv_heads: int, bias: bool) -> dict:
    """Parameters in the course's names; biases random and far from zero."""
    head_dim = d_model // num_heads
    widths = {"q_proj": num_heads * head_dim, "k_proj": num_kv_heads * head_dim,
              "v_proj": num_kv_heads * head_dim}
    state = {f"{name}.weight": _weight(inputs, width, d_model) for name, width in widths.items()}
    state["out_proj.weight"] = _weight(inputs, d_model, num_heads * head_dim)
    if bias:
        state.update({f"{name}.bias": inputs.randn(width) * 0.5 for name, width in widths.items()})
        state["out_proj.bias"] = inputs.randn(d_model) * 0.5
    return state


def _recipe(state: dict, d_model: int, num_heads: int, num_kv_heads: int) -> ModuleCall:
    init = {"d_model": d_model, "num_heads": num_heads, "num_kv_heads": num_kv_heads}
    if "q_proj.bias" in state:
        init["bias"] = True
    return ModuleCall(init_kwargs=init, state=state)


def _module_inputs(inputs, case):
    """``(x, state, recipe, H_q, H_kv)`` for a case of MODULE_CASES."""
    _, batch, length, d_model, num_heads, num_kv_heads, bias = case
    x = inputs.randn(batch, length, d_model)
    state = _module_state(inputs, d_model, num_heads, num_kv_heads, bias)
    return x, state, _recipe(state, d_model, num_heads, num_kv_heads), num_heads, num_kv_heads


@exercise("GroupedQueryAttention")
@pytest.mark.parametrize("case", MODULE_CASES, ids=case_ids(MODULE_CASES))
def test_module_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    x, _, recipe, _, _ = _module_inputs(inputs, case)
    expect_module_matches_reference(submission, reference, bugs, "GroupedQueryAttention", recipe, x)


@exercise("GroupedQueryAttention")
@pytest.mark.parametrize("case", MODULE_CASES[:3], ids=case_ids(MODULE_CASES[:3]))
def test_module_matches_pytorch(submission, bugs, inputs, case):
    """matches F.linear projections and F.scaled_dot_product_attention on every query head"""
    x, state, recipe, num_heads, num_kv_heads = _module_inputs(inputs, case)
    got, call = run_module(submission, "GroupedQueryAttention", recipe, x)
    expect_close(got, oracles.gqa_module(state, num_heads, num_kv_heads, x), call,
                 lookalikes=bugs.module("GroupedQueryAttention", recipe, x),
                 reference="F.linear and F.scaled_dot_product_attention, query head h with K/V head h // group")


@exercise("GroupedQueryAttention")
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_module_with_groups_of_one_is_nn_multihead_attention(submission, bugs, inputs, bias):
    """with num_kv_heads == num_heads, equals nn.MultiheadAttention holding the same weights"""
    x, state, recipe, num_heads, _ = _module_inputs(inputs, ("B2-T5-D12-Hq3-Hkv3", 2, 5, 12, 3, 3, bias))
    got, call = run_module(submission, "GroupedQueryAttention", recipe, x)
    expected = oracles.multihead_attention_module(state, num_heads, x)
    expect_close(got, expected, call, lookalikes=bugs.module("GroupedQueryAttention", recipe, x),
                 reference="nn.MultiheadAttention")


@exercise("GroupedQueryAttention")
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_module_parameters(submission, inputs, bias):
    """has q_proj (H_q*d, D), k_proj and v_proj (H_kv*d, D) and out_proj (D, H_q*d), biases only with bias=True"""
    d_model, num_heads, num_kv_heads = 12, 6, 2  # d = 2: k_proj and v_proj give 4 features, q_proj 12
    x = inputs.randn(2, 3, d_model)
    init = {"d_model": d_model, "num_heads": num_heads, "num_kv_heads": num_kv_heads, "bias": bias}
    recipe = ModuleCall(init_kwargs=init, return_state=True)
    got, call = run_module(submission, "GroupedQueryAttention", recipe, x)
    _, state = unpack(got, ("output", "state"), call)
    if not isinstance(state, dict):
        fail(f"{call}: could not read the module's state_dict")
    widths = {"q_proj": 12, "k_proj": 4, "v_proj": 4}
    expected = {f"{name}.weight": (width, d_model) for name, width in widths.items()}
    expected["out_proj.weight"] = (d_model, 12)
    if bias:
        expected.update({f"{name}.bias": (width,) for name, width in widths.items()})
        expected["out_proj.bias"] = (d_model,)

    def listing(shapes: dict) -> str:
        return ", ".join(f"{name} {tuple(shape)}" for name, shape in sorted(shapes.items()))

    found = {name: tuple(value.shape) for name, value in state.items() if hasattr(value, "shape")}
    expect_true(found == expected, f"{recipe.text('GroupedQueryAttention')} has parameters "
                f"{listing(found) or 'none'}; expected {listing(expected)}")


# Masks of every shape the docstring allows, including one per query head.
MODULE_MASKS = {"T-T": (6, 6), "B-1-T-T": (2, 1, 6, 6), "B-Hq-T-T": (2, 4, 6, 6)}


@exercise("GroupedQueryAttention")
@pytest.mark.parametrize("kind", list(MODULE_MASKS))
def test_module_with_mask(submission, reference, bugs, inputs, kind):
    """with a mask, matches the reference and PyTorch"""
    x, state, recipe, num_heads, num_kv_heads = _module_inputs(
        inputs, ("B2-T6-D8-Hq4-Hkv2-bias", 2, 6, 8, 4, 2, True))
    mask = inputs.mask(*MODULE_MASKS[kind])
    got, call = run_module(submission, "GroupedQueryAttention", recipe, x, mask=mask)
    what = f"{call} (mask {kind}, True = may attend)"
    lookalikes = bugs.module("GroupedQueryAttention", recipe, x, mask=mask)
    expect_close(got, reference_module_call(reference, "GroupedQueryAttention", recipe, x, mask=mask), what,
                 lookalikes=lookalikes)
    expect_close(got, oracles.gqa_module(state, num_heads, num_kv_heads, x, mask), what, lookalikes=lookalikes,
                 reference="F.linear and F.scaled_dot_product_attention on every query head")


@exercise("GroupedQueryAttention")
def test_module_refuses_query_heads_not_a_multiple(submission, inputs):
    """raises ValueError when num_heads is not a multiple of num_kv_heads"""
    recipe = ModuleCall(init_kwargs={"d_model": 12, "num_heads": 6, "num_kv_heads": 4})
    expect_raises(submission, "GroupedQueryAttention", (inputs.randn(2, 3, 12),), {}, ("ValueError",),
                  UNEVEN_GROUPS, module=recipe)


@exercise("GroupedQueryAttention")
def test_module_gradient(submission, inputs):
    """has the gradient of PyTorch's attention with respect to x (autograd)"""
    x, state, recipe, num_heads, num_kv_heads = _module_inputs(inputs, MODULE_CASES[1])
    upstream = inputs.randn(*x.shape)
    grad = {"wrt": [0], "output": None, "grad_output": upstream}
    got, grads = submission.call("GroupedQueryAttention", (x,), {}, grad=grad, module=recipe)
    call = submission.call_text("GroupedQueryAttention", (x,), {}, module=recipe)

    expect_close(got, oracles.gqa_module(state, num_heads, num_kv_heads, x), call, reference="PyTorch")
    expected = oracles.gqa_module_gradient(state, num_heads, num_kv_heads, x, upstream)
    expect_gradients(grads, [expected], ("x",), call)


# -- kv_cache_bytes ------------------------------------------------------------------------

# (id, batch, seq_len, layers, H_kv, d, dtype): LLaMA-3-8B-like and 70B-like
# configurations (32 and 80 layers, 8 K/V heads of width 128), small ones, an int8 cache.
CACHE_CASES = [
    ("llama3-8b-B1-T8192-bf16", 1, 8192, 32, 8, 128, torch.bfloat16),
    ("llama3-70b-B8-T4096-fp16", 8, 4096, 80, 8, 128, torch.float16),
    ("B2-T10-L3-Hkv4-d16-fp32", 2, 10, 3, 4, 16, torch.float32),
    ("B3-T100-L2-Hkv2-d64-int8", 3, 100, 2, 2, 64, torch.int8),
    ("B1-T1-L1-Hkv1-d1-fp64", 1, 1, 1, 1, 1, torch.float64),
    ("B4-T7-L5-Hkv3-d10-bf16", 4, 7, 5, 3, 10, torch.bfloat16),
]


@exercise("kv_cache_bytes")
@pytest.mark.parametrize("case", CACHE_CASES, ids=case_ids(CACHE_CASES))
def test_cache_bytes_follow_the_formula(submission, bugs, case):
    """equals 2 (K and V) x batch x seq_len x layers x H_kv x head_dim x bytes per number"""
    args = case[1:]
    got, call = run(submission, "kv_cache_bytes", *args)
    expect_int(got, oracles.cache_bytes(*args), call, bugs.kv_cache_bytes(*args),
                  f"2 x B x T x layers x H_kv x d x {args[-1].itemsize} bytes")


@exercise("kv_cache_bytes")
@pytest.mark.parametrize("case", CACHE_CASES[::2], ids=case_ids(CACHE_CASES[::2]))
def test_cache_bytes_match_reference(submission, reference, bugs, case):
    """matches the reference"""
    args = case[1:]
    got, call = run(submission, "kv_cache_bytes", *args)
    expect_int(got, reference.kv_cache_bytes(*args), call, bugs.kv_cache_bytes(*args), "the reference")


@exercise("kv_cache_bytes")
def test_cache_shrinks_by_the_group_size(submission, bugs):
    """32 query heads: MHA (32 K/V heads), GQA with 8 and 4, MQA (1) cache 1, 1/4, 1/8 and 1/32 as much"""
    num_query_heads, config = 32, (1, 8192, 32)  # batch, tokens, layers of a LLaMA-3-8B-like model
    mha, call = run(submission, "kv_cache_bytes", *config, num_query_heads, 128, torch.bfloat16)
    expect_int(mha, oracles.cache_bytes(*config, num_query_heads, 128, torch.bfloat16), call,
                  bugs.kv_cache_bytes(*config, num_query_heads, 128, torch.bfloat16),
                  "2 x B x T x layers x H_kv x d x 2 bytes")
    for num_kv_heads in (8, 4, 1):
        got, call = run(submission, "kv_cache_bytes", *config, num_kv_heads, 128, torch.bfloat16)
        group = num_query_heads // num_kv_heads
        expect_int(got, mha // group, call, bugs.kv_cache_bytes(*config, num_kv_heads, 128, torch.bfloat16),
                      f"your MHA cache of {mha} bytes / {group}: {group} query heads share each K/V head")


# -- every exercise -----------------------------------------------------------------------

# A tensor made without device= stays on the CPU on a GPU machine; the
# worker's device tracking shows where, on any machine.
test_would_run_on_a_gpu = portability_check([
    portable("expand_kv_heads", lambda inputs: ((inputs.randn(2, 2, 5, 3), 4), {})),
    portable("grouped_query_attention", lambda inputs: (
        _gqa_inputs(inputs, GQA_CASES[0]), {"mask": inputs.mask(5, 7)})),
    portable("GroupedQueryAttention", lambda inputs: (
        (inputs.randn(2, 6, 8),),
        {"mask": inputs.mask(6, 6), "module": _module_inputs(inputs, MODULE_CASES[0])[2]})),
    portable("kv_cache_bytes", lambda inputs: ((2, 16, 4, 2, 8, torch.bfloat16), {})),
])
