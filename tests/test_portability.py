"""Code that would break on a GPU is caught on any machine.

The worker follows which tensors a call makes on a fixed device (no
``device=``) and fails the "would run on a GPU too" check of the exercise
where such a tensor meets the inputs, naming both lines. What PyTorch allows
across devices (CPU scalars, CPU indices, tensors moved with ``.to``,
buffers moved with the module) must pass.
"""

import warnings

import pytest
import torch

from conftest import result_of, solution_source
from grader.catalog import find_chapter
from grader.portability import DeviceTracker

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


# -- the rule, on a table of idioms -------------------------------------------
# Each idiom is a few lines a student or a codebase writes, given the inputs
# ``x`` (B, T, T) float and ``lengths`` (B,) int64. Its verdict is proven on a
# device before the tracker is held to it: on ``meta`` (every machine has it:
# a meta tensor that meets a CPU tensor with dimensions raises, as on a GPU),
# and on CUDA where there is one.

TRIANGLE = torch.ones(4, 4).tril() > 0  # a module-level constant


def _subsequent_mask(size: int) -> torch.Tensor:
    """The Annotated Transformer's: True where a query may look, made on the CPU."""
    return torch.triu(torch.ones(1, size, size), diagonal=1) == 0


def _in_device_context(x, lengths):
    with torch.device(x.device):
        future = torch.ones(x.shape[-1], x.shape[-1]).triu(1)
    return x - future


MOVED = {
    "type_as-tril": lambda x, lengths: x.masked_fill(torch.tril(torch.ones(4, 4)).type_as(x) == 0, 0.0),
    "type_as-subsequent-mask": lambda x, lengths: x * _subsequent_mask(4).type_as(x),
    "type_as-opennmt-sequence-mask": lambda x, lengths: x.masked_fill(
        ~torch.arange(0, 4).type_as(lengths).repeat(2, 1).lt(lengths.unsqueeze(1))[:, None, :], 0.0),
    "new_tensor": lambda x, lengths: x + x.new_tensor(TRIANGLE.float()),
    "new_ones": lambda x, lengths: x * x.new_ones(4, 4).tril(),
    "copy_-into-empty": lambda x, lengths: x + torch.empty(4, 4, device=x.device).copy_(TRIANGLE),
    "to-tensor": lambda x, lengths: x + torch.ones(4, 4).tril().to(x),
    "to-device": lambda x, lengths: x + torch.ones(4, 4).tril().to(x.device),
    "to-device-and-dtype": lambda x, lengths: x + TRIANGLE.to(device=x.device, dtype=x.dtype),
    "device-context": _in_device_context,
    "ones_like": lambda x, lengths: x * torch.ones_like(x[0]).tril(),
    "factory-with-device": lambda x, lengths: x + torch.ones(4, 4, device=x.device),
    "cpu-scalar": lambda x, lengths: x * torch.tensor(2.0),
    "cpu-index": lambda x, lengths: x[:, torch.arange(4)],
}
STAYS = {
    "factory-without-device": lambda x, lengths: x + torch.ones(4, 4),
    "mask-without-device": lambda x, lengths: x.masked_fill(torch.ones(4, 4, dtype=torch.bool).tril(), 0.0),
    "arange-against-lengths": lambda x, lengths: torch.arange(4) < lengths[:, None],
    "module-level-constant": lambda x, lengths: x.masked_fill(TRIANGLE, 0.0),
    "to-dtype-only": lambda x, lengths: x + torch.ones(4, 4).to(x.dtype),
    "type_as-a-cpu-tensor": lambda x, lengths: x.type_as(TRIANGLE.float()) + 1,
    "cpu-method": lambda x, lengths: x.cpu() + 1,
    "cat-with-cpu": lambda x, lengths: torch.cat([x, torch.zeros(1, 4, 4)]),
}


def _inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 4, 4, device=device), torch.tensor([3, 4], device=device)


def runs_on(idiom, device: str) -> bool:
    """Whether ``idiom`` runs with its inputs on ``device`` and answers there."""
    x, lengths = _inputs(device)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # new_tensor's advice to copy with clone()
            result = idiom(x, lengths)
    except (RuntimeError, NotImplementedError):  # meta refuses to copy to the CPU
        return False
    return result.device.type == x.device.type


def tracker_verdict(idiom) -> dict | None:
    """What the worker's tracker finds, running ``idiom`` on the CPU."""
    x, lengths = _inputs("cpu")
    tracker = DeviceTracker(__file__)
    tracker.mark_inputs((x, lengths))
    with warnings.catch_warnings(), tracker:
        warnings.simplefilter("ignore")
        result = idiom(x, lengths)
    return tracker.problem(result)


DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


def _meta_new_tensor_lands_on_the_cpu() -> bool:
    """torch 2.5's ``new_tensor`` of a meta tensor answers on the CPU (a meta
    quirk: on CUDA it answers on CUDA), so meta cannot stand in for CUDA there."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.zeros(1, device="meta").new_tensor(torch.zeros(1)).device.type == "cpu"


@pytest.mark.parametrize("name", MOVED)
def test_an_idiom_that_moves_data_to_the_inputs_device_passes(name):
    for device in DEVICES:
        if device == "meta" and name == "new_tensor" and _meta_new_tensor_lands_on_the_cpu():
            continue
        assert runs_on(MOVED[name], device), f"{name} does not run on {device}"
    assert tracker_verdict(MOVED[name]) is None


@pytest.mark.parametrize("name", STAYS)
def test_an_idiom_that_leaves_data_on_the_cpu_is_found(name):
    for device in DEVICES:
        assert not runs_on(STAYS[name], device), f"{name} runs on {device}"
    problem = tracker_verdict(STAYS[name])
    assert problem is not None and problem["kind"] in ("mixed", "returned")
