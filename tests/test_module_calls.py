"""Exercises that are nn.Module classes: built, loaded and called in the worker."""

import pytest
import torch

from conftest import FAST
from grader.catalog import find_chapter
from grader.compare import CheckFailure
from grader.loading import load_submission
from grader.module_calls import ModuleCall, run_module_call
from grader.remote_submission import RemoteSubmission

SCALER = '''
import torch
from torch import nn


class Scaler(nn.Module):
    def __init__(self, width, factor=2.0):
        super().__init__()
        self.factor = factor
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x, shift=0.0):
        if self.training:
            x = torch.nn.functional.dropout(x, 0.5)
        return x * self.weight * self.factor + shift


class NotAModule:
    def __init__(self, width):
        pass


def function(x):
    return x
'''


@pytest.fixture
def remote(tmp_path):
    path = tmp_path / "ch03_scaler.py"
    path.write_text(SCALER)
    submission = RemoteSubmission(find_chapter("ch03"), load_submission(path, "ch03_scaler"), FAST,
                                  torch.device("cpu"))
    submission.begin_check("MultiHeadAttention")
    yield submission
    submission.close()


def test_a_class_is_built_loaded_and_called_in_the_worker(remote):
    recipe = ModuleCall(init_args=(3,), init_kwargs={"factor": 3.0},
                        state={"weight": torch.tensor([1.0, 2.0, 3.0])}, return_state=True)
    output, state = remote.call("Scaler", (torch.ones(2, 3),), {"shift": 1.0}, module=recipe)
    assert torch.equal(output, torch.tensor([[4.0, 7.0, 10.0]] * 2))
    assert list(state) == ["weight"] and torch.equal(state["weight"], torch.tensor([1.0, 2.0, 3.0]))


def test_train_mode_and_seed_reach_the_module(remote):
    recipe = ModuleCall(init_args=(64,), train=True, seed=7)
    first = remote.call("Scaler", (torch.ones(4, 64),), {}, module=recipe)
    again = remote.call("Scaler", (torch.ones(4, 64),), {}, module=recipe)
    assert torch.equal(first, again)  # the same seed drops the same entries
    assert set(first.unique().tolist()) == {0.0, 4.0}  # dropout (p=0.5) ran: x * 2 / (1 - p)
    assert torch.equal(first, run_module_call(_local_scaler(), "Scaler", recipe, [torch.ones(4, 64)], {}))


@pytest.mark.parametrize("state, message", [
    ({"qkv.weight": torch.ones(3)}, "Scaler(3) has no parameter qkv.weight (it has weight)"),
    ({}, "Scaler(3) has parameters the grader does not expect: weight"),
    ({"weight": torch.ones(4)}, "Scaler(3): weight has shape (3,), expected (4,)"),
])
def test_a_state_that_does_not_fit_is_named_in_one_line(remote, state, message):
    recipe = ModuleCall(init_args=(3,), state=state)
    with pytest.raises(CheckFailure) as failure:
        remote.call("Scaler", (torch.ones(3),), {}, module=recipe)
    assert message in failure.value.message and "\n" not in failure.value.message


def test_a_class_that_is_not_a_module_is_refused(remote):
    with pytest.raises(CheckFailure, match="NotAModule\\(3\\) is a NotAModule, not a torch.nn.Module"):
        remote.call("NotAModule", (torch.ones(3),), {}, module=ModuleCall(init_args=(3,)))


def test_a_function_where_a_class_is_expected_is_named(remote):
    with pytest.raises(CheckFailure, match="function is a function, not a class") as failure:
        remote.call("function", (torch.ones(3),), {}, module=ModuleCall())
    assert failure.value.kind == "missing"
    with pytest.raises(CheckFailure, match="defines no class Missing"):
        remote.call("Missing", (torch.ones(3),), {}, module=ModuleCall())


def test_the_call_reads_like_python(remote):
    recipe = ModuleCall(init_args=(3,), init_kwargs={"factor": 3.0}, train=True)
    text = remote.call_text("Scaler", (torch.ones(2, 3),), {"shift": 1.0}, module=recipe)
    assert text == "Scaler(3, factor=3.0).train()(x (2, 3), shift=1.0)"


def _local_scaler():
    namespace = {}
    exec(compile(SCALER, "scaler", "exec"), namespace)
    return type("Namespace", (), namespace)


def test_tuple_arguments_are_described_by_their_shapes_not_values(remote):
    cache = (torch.full((1, 2, 3, 4), 0.123), torch.full((1, 2, 3, 5), 0.456))
    text = remote.call_text("function", (torch.ones(2, 3),), {"cache": cache, "note": "x" * 100})
    assert "cache ((1, 2, 3, 4), (1, 2, 3, 5))" in text
    assert "0.123" not in text and len(text) < 160
