"""Chapter 3 (multi-head attention): the reference passes, the stub scores
nothing, realistic wrong versions fail with feedback a student can act on,
the module matches nn.MultiheadAttention once loaded with its weights, and
parameter_count is a formula: counting the parameters of a module built for
the purpose (PyTorch's, on the meta device, or one's own) scores nothing."""

import pytest
import torch
from torch import nn

from conftest import FAST, Draw, replace_function, result_of, solution_source, statuses, stub_source
from grader.catalog import find_chapter
from grader.grading import grade

CH03 = find_chapter("ch03")
SOLUTION = solution_source(CH03)
ORACLE_CHECK = "loaded with nn.MultiheadAttention's weights, gives its output"


def edit(source: str, old: str, new: str) -> str:
    """``source`` with the one occurrence of ``old`` replaced."""
    assert source.count(old) == 1, old
    return source.replace(old, new)


@pytest.fixture(scope="module")
def solution_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("ch03") / CH03.file_name
    path.write_text(SOLUTION, encoding="utf-8")
    return grade([(CH03, path)], limits=FAST, seed=1234)


def hints(result) -> list[str]:
    return [check.hint or "" for check in result.failed_checks]


def messages(result) -> str:
    return "\n".join(check.message for check in result.failed_checks)


# -- whole chapter ---------------------------------------------------------------------------


def test_solution_scores_full_marks(solution_report):
    assert solution_report.score == solution_report.max_score == 11
    assert set(statuses(solution_report).values()) == {"passed"}


def test_stub_scores_nothing(grade_source):
    report = grade_source(stub_source(CH03), chapter="ch03")
    assert report.score == 0
    assert set(statuses(report).values()) == {"not implemented"}


# -- acceptance: the module is nn.MultiheadAttention once loaded with its weights -------------


def _loaded_pair(d_model: int, heads: int, bias: bool):
    """An nn.MultiheadAttention with random non-zero biases, and the
    reference module loaded with its parameters; both in eval mode."""
    torch.manual_seed(d_model * 10 + heads)
    theirs = nn.MultiheadAttention(d_model, heads, bias=bias, batch_first=True)
    state = {"qkv.weight": theirs.in_proj_weight, "out.weight": theirs.out_proj.weight}
    if bias:
        with torch.no_grad():  # a fresh nn.MultiheadAttention's biases are all zero
            theirs.in_proj_bias.normal_()
            theirs.out_proj.bias.normal_()
        state.update({"qkv.bias": theirs.in_proj_bias, "out.bias": theirs.out_proj.bias})
    namespace = {}
    exec(compile(SOLUTION, "ch03_reference", "exec"), namespace)
    mine = namespace["MultiHeadAttention"](d_model, heads, bias=bias)
    mine.load_state_dict(state)
    return theirs.eval(), mine.eval()


@pytest.mark.parametrize("d_model, heads, bias", [(8, 2, True), (12, 3, False), (6, 1, True), (4, 4, True)],
                         ids=["D8-H2", "D12-H3-no-bias", "D6-H1", "D4-H4"])
def test_reference_module_matches_torch_multihead_attention(d_model, heads, bias):
    theirs, mine = _loaded_pair(d_model, heads, bias)
    x = torch.randn(3, 5, d_model)
    mask = torch.rand(5, 5) < 0.6
    mask[:, 0] = True  # every query keeps a key
    with torch.no_grad():
        expected, _ = theirs(x, x, x, need_weights=False)
        torch.testing.assert_close(mine(x), expected)
        expected, expected_weights = theirs(x, x, x, attn_mask=~mask, average_attn_weights=False)
        output, weights = mine(x, mask=mask, need_weights=True)
    torch.testing.assert_close(output, expected)
    torch.testing.assert_close(weights, expected_weights)


def test_grader_checks_the_module_against_torch_multihead_attention(solution_report, grade_source):
    passed = [check for check in result_of(solution_report, "MultiHeadAttention").checks
              if check.check.startswith(ORACLE_CHECK)]
    assert len(passed) == 5 and all(check.outcome == "passed" for check in passed)
    # A module that forgets the output projection's bias (no known bug) fails that check.
    source = edit(SOLUTION, "output = self.out(merge_heads(weights @ v))",
                  "output = merge_heads(weights @ v) @ self.out.weight.T")
    result = result_of(grade_source(source, chapter="ch03"), "MultiHeadAttention")
    assert result.status == "failed"
    failed = [check for check in result.failed_checks if check.check.startswith(ORACLE_CHECK)]
    assert failed and all("against nn.MultiheadAttention" in check.message for check in failed)
    assert any("[no-bias]" in check.check for check in result.checks if check.outcome == "passed")


# -- pitfalls, written the way students write them -----------------------------------------------


def test_merging_with_view_on_a_transposed_tensor_is_explained(grade_source):
    source = replace_function(SOLUTION, "merge_heads", '''
def merge_heads(x):
    *batch, heads, length, width = x.shape
    return x.transpose(-3, -2).view(*batch, length, heads * width)
''')
    result = result_of(grade_source(source, chapter="ch03"), "merge_heads")
    assert result.status == "failed"
    assert "view size is not compatible" in messages(result)
    assert any(".contiguous()" in hint and ".reshape" in hint for hint in hints(result))


def test_contiguous_view_is_an_accepted_fix(grade_source):
    source = edit(SOLUTION, "return x.reshape(*batch, length, heads * width)",
                  "return x.contiguous().view(*batch, length, heads * width)")
    assert statuses(grade_source(source, chapter="ch03"))["merge_heads"] == "passed"


def test_split_heads_for_exactly_one_batch_dim_says_which_shape_broke(grade_source):
    source = edit(SOLUTION, "*batch, length, width = x.shape", "batch, length, width = x.shape")
    source = edit(source, "x = x.reshape(*batch, length, num_heads, width // num_heads)",
                  "x = x.view(batch, length, num_heads, width // num_heads)")
    result = result_of(grade_source(source, chapter="ch03"), "split_heads")
    assert result.status == "failed"
    text = messages(result)
    assert "split_heads(x (5, 6), 2) raised ValueError" in text  # no batch dimension
    assert "(2, 3, 4, 12)" in text  # two batch dimensions


def test_x_times_w_everywhere_is_named(grade_source):
    source = SOLUTION
    for name in ("query @ w_q.T", "key @ w_k.T", "value @ w_v.T", "@ w_o.T"):
        source = edit(source, name, name.removesuffix(".T"))
    result = result_of(grade_source(source, chapter="ch03"), "multi_head_attention")
    assert result.status == "failed"
    assert any("x @ W.T" in hint for hint in hints(result))


def test_scaling_by_the_input_width_is_named(grade_source):
    source = edit(SOLUTION, "/ math.sqrt(q.shape[-1])  # (..., H, L, S)",
                  "/ math.sqrt(query.shape[-1])  # (..., H, L, S)")
    result = result_of(grade_source(source, chapter="ch03"), "multi_head_attention")
    assert result.status == "failed"
    assert any("1/sqrt(D // H)" in hint for hint in hints(result))


def test_dropout_module_on_the_output_is_named(grade_source):
    source = edit(SOLUTION, "self.out = nn.Linear(d_model, d_model, bias=bias)",
                  "self.out = nn.Linear(d_model, d_model, bias=bias)\n"
                  "        self.drop = nn.Dropout(dropout)")
    source = edit(source, "weights = F.dropout(weights, p=self.dropout, training=self.training)\n"
                  "        output = self.out(merge_heads(weights @ v))",
                  "output = self.drop(self.out(merge_heads(weights @ v)))")
    result = result_of(grade_source(source, chapter="ch03"), "MultiHeadAttention")
    assert result.status == "failed"
    assert any("dropout is applied to the output" in hint for hint in hints(result))


def test_separate_projections_are_told_the_expected_names(grade_source):
    source = edit(SOLUTION, "self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)",
                  "self.q = nn.Linear(d_model, d_model, bias=bias)\n"
                  "        self.k = nn.Linear(d_model, d_model, bias=bias)\n"
                  "        self.v = nn.Linear(d_model, d_model, bias=bias)")
    source = edit(source, "q, k, v = self.qkv(x).chunk(3, dim=-1)",
                  "q, k, v = self.q(x), self.k(x), self.v(x)")
    result = result_of(grade_source(source, chapter="ch03"), "MultiHeadAttention")
    assert result.status == "failed"
    text = messages(result)
    assert "has no parameter qkv.weight" in text and "q.weight" in text


def test_parameter_count_as_float_is_refused(grade_source):
    source = edit(SOLUTION, "return 4 * per_projection", "return 4.0 * per_projection")
    result = result_of(grade_source(source, chapter="ch03"), "parameter_count")
    assert result.status == "failed"
    assert "expected an int" in messages(result)



def test_heads_viewed_straight_to_h_t_d_are_named(grade_source):
    # view without permute: x.view(B, H, T, d) instead of x.view(B, T, H, d).transpose(1, 2).
    source = edit(SOLUTION, "return x.transpose(-3, -2)  # (..., H, T, d)",
                  "return x.view(*batch, num_heads, length, width // num_heads)")
    result = result_of(grade_source(source, chapter="ch03"), "split_heads")
    assert result.status == "failed"
    assert "max abs error" in result.failed_checks[0].message  # no error: the values are wrong
    assert result.reason.startswith("looks like x is viewed (or reshaped) straight to (..., H, T, d)")


def test_heads_viewed_straight_in_the_module_are_named_at_each_step(grade_source):
    # In the module the same view meets a chunk of the fused qkv output, which
    # is not contiguous: first it raises, then, with .contiguous(), it is wrong.
    viewed = "t.view(*t.shape[:-2], self.num_heads, t.shape[-2], -1)"
    source = edit(SOLUTION, "q, k, v = (split_heads(t, self.num_heads) for t in (q, k, v))",
                  f"q, k, v = ({viewed} for t in (q, k, v))")
    result = result_of(grade_source(source, chapter="ch03"), "MultiHeadAttention")
    assert "view size is not compatible" in result.failed_checks[0].message
    assert "a chunk of the fused qkv output" in result.reason and ".contiguous()" in result.reason
    source = source.replace("t.view(", "t.contiguous().view(")
    result = result_of(grade_source(source, chapter="ch03"), "MultiHeadAttention")
    assert "max abs error" in result.failed_checks[0].message
    assert result.reason.startswith("looks like x is viewed (or reshaped) straight to (..., H, T, d)")


def test_merging_in_the_module_without_contiguous_is_named(grade_source):
    # nanoGPT's y.transpose(1, 2).contiguous().view(B, T, C), .contiguous() forgotten.
    source = edit(SOLUTION, "output = self.out(merge_heads(weights @ v))",
                  "output = self.out((weights @ v).transpose(-3, -2).view(*x.shape[:-1], -1))")
    result = result_of(grade_source(source, chapter="ch03"), "MultiHeadAttention")
    assert result.status == "failed"
    assert "view size is not compatible" in result.failed_checks[0].message
    assert "not contiguous (the heads transposed" in result.reason
    fixed = source.replace(".transpose(-3, -2).view(", ".transpose(-3, -2).contiguous().view(")
    assert statuses(grade_source(fixed, chapter="ch03"))["MultiHeadAttention"] == "passed"


def test_a_module_that_gives_nan_for_a_query_with_no_key_fails(grade_source):
    # The plain softmax: right wherever a query keeps a key, NaN where it has none.
    source = edit(SOLUTION, "        no_keys = torch.isneginf(scores).all(dim=-1, keepdim=True)\n"
                  "        weights = torch.softmax(scores.masked_fill(no_keys, 0.0), dim=-1)"
                  ".masked_fill(no_keys, 0.0)\n",
                  "        weights = torch.softmax(scores, dim=-1)\n")
    result = result_of(grade_source(source, chapter="ch03"), "MultiHeadAttention")
    assert result.status == "failed"
    [check] = result.failed_checks
    assert check.check == "a query whose keys are all masked gets zero weights, not NaN"
    assert "has NaN" in check.message and "may attend to no key" in check.message
    assert "zero weights" in check.hint


# -- parameter_count: a formula, never modules built and counted -------------------------------

COUNT_CHECK = "is a formula: builds no module nor tensor, and counts a model of d_model = 1,000,000 at once"

# Counts that build what they count: PyTorch's module, four nn.Linear, the module on the
# meta device (no memory at all), an encoder layer's attention, the file's own module.
MODULE_COUNTS = {
    "nn.MultiheadAttention": '''
def parameter_count(d_model, num_heads, bias=True):
    return sum(p.numel() for p in nn.MultiheadAttention(d_model, num_heads, bias=bias).parameters())
''',
    "four-nn.Linear": '''
def parameter_count(d_model, num_heads, bias=True):
    layers = [nn.Linear(d_model, d_model, bias=bias) for _ in range(4)]
    return sum(p.numel() for layer in layers for p in layer.parameters())
''',
    "on-the-meta-device": '''
def parameter_count(d_model, num_heads, bias=True):
    module = nn.MultiheadAttention(d_model, num_heads, bias=bias, device="meta")
    return sum(p.numel() for p in module.parameters())
''',
    "nn.TransformerEncoderLayer": '''
def parameter_count(d_model, num_heads, bias=True):
    layer = nn.TransformerEncoderLayer(d_model, num_heads, dim_feedforward=1, bias=bias)
    return sum(p.numel() for p in layer.self_attn.parameters())
''',
    "own-module": '''
def parameter_count(d_model, num_heads, bias=True):
    return sum(p.numel() for p in MultiHeadAttention(d_model, num_heads, bias=bias).parameters())
''',
}

# Correct counts written otherwise.
FORMULAS = {
    "factored": '''
def parameter_count(d_model, num_heads, bias=True):
    return 4 * d_model * (d_model + int(bias))
''',
    "shapes-listed": '''
def parameter_count(d_model, num_heads, bias=True):
    shapes = [(3 * d_model, d_model), (d_model, d_model)]  # qkv.weight, out.weight
    if bias:
        shapes += [(3 * d_model,), (d_model,)]  # qkv.bias, out.bias
    return sum(math.prod(shape) for shape in shapes)
''',
    "head-by-head": '''
def parameter_count(d_model, num_heads, bias=True):
    d = d_model // num_heads
    per_head = 3 * (d_model * d + (d if bias else 0))  # the head's slices of q, k and v
    return num_heads * per_head + d_model * d_model + (d_model if bias else 0)
''',
}


def _grade_count(source: str, tmp_path):
    """The report of ``parameter_count`` alone."""
    path = tmp_path / CH03.file_name
    path.write_text(source, encoding="utf-8")
    return result_of(grade([(CH03, path)], limits=FAST, seed=1234, only={"parameter_count"}),
                     "parameter_count")


def test_counting_the_parameters_of_nn_multiheadattention_scores_nothing(grade_source):
    code = MODULE_COUNTS["nn.MultiheadAttention"]
    report = grade_source(replace_function(SOLUTION, "parameter_count", code), chapter="ch03")
    result = result_of(report, "parameter_count")
    assert result.status == "failed" and result.score == 0
    assert COUNT_CHECK in {check.check for check in result.failed_checks}
    assert {name for name, status in statuses(report).items() if status != "passed"} == {"parameter_count"}


@pytest.mark.parametrize("code", MODULE_COUNTS.values(), ids=MODULE_COUNTS.keys())
def test_counting_a_built_module_scores_nothing(tmp_path, code):
    result = _grade_count(replace_function(SOLUTION, "parameter_count", code), tmp_path)
    assert result.status == "failed" and result.score == 0
    assert COUNT_CHECK in {check.check for check in result.failed_checks}


def _without_the_catalogs_refusals(monkeypatch):
    """Grade as if the catalog forbade nothing: the check alone judges."""
    import grader.remote_submission

    monkeypatch.setattr(grader.remote_submission.RemoteSubmission, "_forbidden", lambda self, exercise: ())


def test_a_module_too_wide_to_build_is_explained(tmp_path, monkeypatch):
    _without_the_catalogs_refusals(monkeypatch)
    result = _grade_count(replace_function(SOLUTION, "parameter_count", MODULE_COUNTS["four-nn.Linear"]),
                          tmp_path)
    message = next(check.message for check in result.failed_checks if check.check == COUNT_CHECK)
    assert message.startswith("parameter_count(1000000, 8) ran out of memory at line")
    assert message.endswith("a model this wide has 4,000,004,000,000 parameters, more than memory holds: "
                            "count them with a formula in d_model and bias, without building the module")


def test_a_module_built_on_the_meta_device_is_seen(tmp_path, monkeypatch):
    _without_the_catalogs_refusals(monkeypatch)
    result = _grade_count(replace_function(SOLUTION, "parameter_count", MODULE_COUNTS["on-the-meta-device"]),
                          tmp_path)
    assert [check.check for check in result.failed_checks] == [COUNT_CHECK]  # every count is right
    assert result.failed_checks[0].message.startswith(
        "parameter_count(8, 2, bias=True) made a (24, 8) tensor (192 numbers); the count is arithmetic")


@pytest.mark.parametrize("code", FORMULAS.values(), ids=FORMULAS.keys())
def test_a_formula_written_otherwise_keeps_the_point(tmp_path, code):
    result = _grade_count(replace_function(SOLUTION, "parameter_count", code), tmp_path)
    assert result.status == "passed", [(check.check, check.message) for check in result.failed_checks]


# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py); a class's args
    are ``(init args, call args, call kwargs)``."""
    query, key = draw.randn(2, 5, 12), draw.randn(2, 7, 12)
    projections = [draw.weights(12, 12) for _ in range(4)]
    in_proj, out_proj = draw.weights(36, 12), draw.weights(12, 12)
    padding = ~draw.mask(2, 7)  # True = ignore, nn.MultiheadAttention's way
    return [
        ("split_heads", (draw.randn(2, 5, 12), 3), {}),
        ("merge_heads", (draw.randn(2, 3, 5, 4),), {}),
        ("multi_head_attention", (query, key, key, 3, *projections), {"mask": draw.mask(5, 7)}),
        ("multi_head_attention", (query, query, query, 4, *projections), {}),
        ("MultiHeadAttention", ((12, 3), (draw.randn(2, 5, 12),), {"mask": draw.mask(5, 5)}), {}),
        ("MultiHeadAttention", ((12, 3), (draw.randn(2, 5, 12),), {"need_weights": True}), {}),
        ("torch_multihead_forward", (query.transpose(0, 1), key.transpose(0, 1), key.transpose(0, 1), 3,
                                     in_proj, draw.randn(36), out_proj, draw.randn(12)),
         {"key_padding_mask": padding}),
        ("torch_multihead_forward", (query, key, key, 4, in_proj, None, out_proj, None), {"batch_first": True}),
        ("parameter_count", (12, 3), {}),
        ("parameter_count", (8, 2, False), {}),
    ]


# The known bug tests/test_release.py makes in the edition and in this tree.
RELEASE_BUG = ("MultiHeadAttention", "reshape-without-transpose")
