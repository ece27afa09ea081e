"""Code that would break on a GPU is caught on any machine.

The worker follows which tensors a call makes on a fixed device (no
``device=``) and fails the "would run on a GPU too" check of the exercise
where such a tensor meets the inputs, naming both lines. What PyTorch allows
across devices (CPU scalars, CPU indices, tensors moved with ``.to``,
buffers moved with the module) must pass.
"""

import pytest

from conftest import result_of, solution_source
from grader.catalog import find_chapter

CH03, CH04 = find_chapter("ch03"), find_chapter("ch04")
CAUSAL, MULTI_HEAD = solution_source(CH04), solution_source(CH03)

CAUSAL_MASK_CALL = "mask = causal_mask(length, device=x.device)  # (T, T), where the scores are"
LENGTHS_MASK = "keys = torch.arange(length, device=x.device) < lengths[:, None]  # (B, T)"
SCORES = "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)"


def gpu_check(report, exercise: str):
    """The exercise's portability check."""
    return next(check for check in result_of(report, exercise).checks if "GPU" in check.check)


def line_of(source: str, text: str) -> int:
    return source.splitlines().index(next(line for line in source.splitlines() if text in line)) + 1


def test_a_mask_made_without_device_names_where_it_was_made_and_used(grade_source):
    source = CAUSAL.replace(CAUSAL_MASK_CALL, "mask = causal_mask(length)")
    check = gpu_check(grade_source(source, chapter="ch04"), "causal_self_attention")
    assert check.outcome == "failed" and check.kind == "device"
    assert "would fail on a GPU" in check.message
    assert f"called from line {line_of(source, 'mask = causal_mask(length)')} " in check.message
    used = line_of(source, "mask = mask & keys")
    assert f"line {used} (mask = mask & keys[:, None, None, :]) mixes" in check.message
    assert "built on the CPU" in check.hint  # the known bug's hint


def test_a_factory_on_the_line_that_uses_it(grade_source):
    source = CAUSAL.replace(LENGTHS_MASK, "keys = torch.arange(length) < lengths[:, None]")
    report = grade_source(source, chapter="ch04")
    check = gpu_check(report, "causal_self_attention")
    assert check.outcome == "failed"
    assert f"line {line_of(source, 'torch.arange(length) <')} " in check.message
    assert "a tensor it makes on the CPU itself" in check.message
    assert result_of(report, "causal_mask").status == "passed"


def test_a_module_level_constant_is_named_as_made_at_import(grade_source):
    source = CAUSAL.replace("import torch\n", "import torch\n\nTRIANGLE = torch.ones(9, 9).tril() > 0\n", 1)
    source = source.replace(CAUSAL_MASK_CALL, "mask = TRIANGLE[:length, :length]")
    check = gpu_check(grade_source(source, chapter="ch04"), "causal_self_attention")
    assert check.outcome == "failed"
    assert "made on the CPU when your file was imported" in check.message


def test_an_answer_on_the_cpu_fails_even_when_nothing_mixes(grade_source):
    source = CAUSAL.replace("dtype=torch.bool, device=device)", "dtype=torch.bool)")
    check = gpu_check(grade_source(source, chapter="ch04"), "causal_mask")
    assert check.outcome == "failed"
    assert "would return a tensor on the CPU when run on a GPU" in check.message


@pytest.mark.parametrize("old, new", [
    (LENGTHS_MASK, "keys = torch.arange(length).to(x.device) < lengths[:, None]"),
    (LENGTHS_MASK, "keys = torch.arange(length, device=lengths.device) < lengths[:, None]"),
    (LENGTHS_MASK, "keys = x.new_ones(length).cumsum(0) <= lengths[:, None]"),
    (SCORES, "scores = q @ k.transpose(-2, -1) / torch.tensor(float(q.shape[-1])).sqrt()"),
    (CAUSAL_MASK_CALL, "mask = causal_mask(length, device=x.device)[torch.arange(length)]"),
], ids=["to-device", "device-of-lengths", "new-ones", "cpu-scalar", "cpu-index"])
def test_what_pytorch_allows_across_devices_passes(grade_source, old, new):
    report = grade_source(CAUSAL.replace(old, new), chapter="ch04")
    assert gpu_check(report, "causal_self_attention").outcome == "passed"


def with_zeros_attribute(definition: str) -> str:
    """The chapter 3 module with a (64, 64) zeros tensor kept by ``definition``
    and added to the scores."""
    return MULTI_HEAD.replace(
        "        self.out = nn.Linear(d_model, d_model, bias=bias)\n",
        "        self.out = nn.Linear(d_model, d_model, bias=bias)\n" + f"        {definition}\n", 1,
    ).replace("scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., H, T, T)",
              "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + self.zeros[:T, :T]"
              ).replace("        q, k, v = self.qkv(x).chunk(3, dim=-1)",
                        "        T = x.shape[-2]\n        q, k, v = self.qkv(x).chunk(3, dim=-1)")


def test_a_registered_buffer_moves_with_the_module_and_passes(grade_source):
    source = with_zeros_attribute("self.register_buffer('zeros', torch.zeros(64, 64))")
    report = grade_source(source, chapter="ch03")
    assert result_of(report, "MultiHeadAttention").status == "passed"


def test_a_plain_tensor_attribute_stays_behind_and_fails(grade_source):
    source = with_zeros_attribute("self.zeros = torch.zeros(64, 64)")
    check = gpu_check(grade_source(source, chapter="ch03"), "MultiHeadAttention")
    assert check.outcome == "failed"
    assert f"made on the CPU at line {line_of(source, 'self.zeros = torch.zeros')} " in check.message
