"""Chapter 3: the module matches nn.MultiheadAttention, and the pitfalls that
raise rather than return a wrong value are explained."""

import importlib.util

import pytest
import torch

from conftest import replace_function, result_of, solution_source
from grader.catalog import COURSE_ROOT, find_chapter

CH03 = find_chapter("ch03")
SOLUTION = solution_source(CH03)


def _reference():
    path = COURSE_ROOT / "solutions" / f"{CH03.module}.py"
    spec = importlib.util.spec_from_file_location("ch03_reference_for_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_the_module_loaded_with_torchs_weights_gives_torchs_output(bias):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(12, 3, bias=bias, batch_first=True).eval()
    if bias:
        with torch.no_grad():
            theirs.in_proj_bias.normal_()
            theirs.out_proj.bias.normal_()
    ours = _reference().MultiHeadAttention(12, 3, bias=bias).eval()
    state = {"qkv.weight": theirs.in_proj_weight, "out.weight": theirs.out_proj.weight}
    if bias:
        state |= {"qkv.bias": theirs.in_proj_bias, "out.bias": theirs.out_proj.bias}
    ours.load_state_dict(state)
    x = torch.randn(2, 7, 12)
    allowed = torch.rand(7, 7) > 0.4
    allowed |= torch.eye(7, dtype=torch.bool)
    with torch.no_grad():
        expected, expected_weights = theirs(x, x, x, attn_mask=~allowed, average_attn_weights=False)
        output, weights = ours(x, mask=allowed, need_weights=True)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-5, atol=1e-6)


def test_merging_with_view_on_a_transposed_tensor_is_explained(grade_source):
    source = replace_function(SOLUTION, "merge_heads", '''
def merge_heads(x):
    *batch, heads, length, width = x.shape
    return x.transpose(-3, -2).view(*batch, length, heads * width)
''')
    result = result_of(grade_source(source, chapter="ch03"), "merge_heads")
    assert result.status == "failed"
    messages = " ".join(check.message + " " + (check.hint or "") for check in result.failed_checks)
    assert "view size is not compatible" in messages
    assert "contiguous" in messages or "reshape" in messages
