"""Only plain data crosses between a worker and the grader."""

import json

import numpy as np
import pytest
import torch

from grader import wire


def frame_parts(message: dict) -> tuple[bytes, bytes]:
    frame = wire.dump(message)
    return frame[:wire.HEADER.size], frame[wire.HEADER.size:]


def roundtrip(value):
    return wire.decode(wire.load(*frame_parts({"value": wire.encode(value)}))["value"])


def test_tensors_arrays_and_containers_survive():
    value = (torch.arange(6.0).view(2, 3), np.ones((2, 2), dtype=np.float32), [1, 2.5, None, "x"],
             torch.tensor([True, False]), torch.zeros(0, 3), torch.tensor(float("nan")))
    tensor, array, items, flags, empty, nan = roundtrip(value)
    assert type(tensor) is torch.Tensor and torch.equal(tensor, value[0])
    assert isinstance(array, np.ndarray) and array.dtype == np.float32
    assert items == [1, 2.5, None, "x"]
    assert flags.dtype == torch.bool and flags.tolist() == [True, False]
    assert empty.shape == (0, 3) and nan.isnan()


def test_dtypes_survive_as_arguments():
    assert roundtrip([torch.float16, torch.bool]) == [torch.float16, torch.bool]
    with pytest.raises(wire.WireError, match="unknown dtype"):
        wire.decode({"kind": "dtype", "value": "torch.quint8"})


def test_a_dict_with_text_keys_survives():
    state = {"qkv.weight": torch.ones(6, 2), "out.bias": torch.zeros(2), "note": "x"}
    received = roundtrip(state)
    assert list(received) == list(state) and torch.equal(received["qkv.weight"], state["qkv.weight"])


@pytest.mark.parametrize("dtype", list(wire.DTYPES.values()), ids=str)
def test_every_carried_dtype_survives(dtype):
    sent = (torch.arange(6) % 2).to(dtype).view(3, 2)
    received = roundtrip(sent)
    assert received.dtype == dtype and torch.equal(received, sent)


def test_views_are_sent_alone_not_with_their_storage():
    big = torch.zeros(1000, 1000)
    assert len(wire.dump({"value": wire.encode(big[:2, :2])})) < 1000


def test_a_tensor_subclass_arrives_as_a_plain_tensor():
    class Liar(torch.Tensor):
        def __eq__(self, other):
            return True

    received = roundtrip(torch.zeros(3).as_subclass(Liar))
    assert type(received) is torch.Tensor
    assert not torch.equal(received, torch.ones(3))


@pytest.mark.parametrize("value, type_name", [
    (np.array([1, 2], dtype=object), "numpy.ndarray of dtype object"),
    (np.array(["a"]), "numpy.ndarray of dtype <U1"),
    (torch.zeros(2, dtype=torch.uint16), "tensor of dtype torch.uint16"),
    ({1: "a"}, "dict"),
    ({str(i): i for i in range(300)}, "dict of 300 items"),
    (list(range(1000)), "list of 1000 items"),
])
def test_what_is_not_plain_data_arrives_as_a_placeholder(value, type_name):
    received = roundtrip(value)
    assert isinstance(received, wire.Foreign) and received.type_name == type_name


def test_objects_arrive_as_foreign_placeholders():
    class Anything:
        def __eq__(self, other):
            return True

    received = roundtrip(Anything())
    assert isinstance(received, wire.Foreign)
    assert received != 1 and "Anything" in received.type_name



def test_a_module_arrives_as_its_type_and_state_not_as_the_object():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    received = roundtrip((model, [1.5]))[0]
    assert isinstance(received, wire.ModuleState) and received.type_name == "torch.nn.modules.container.Sequential"
    assert sorted(received.state) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert all(type(value) is torch.Tensor for value in received.state.values())
    assert torch.equal(received.state["0.weight"], model[0].weight.detach())


def test_a_module_whose_state_cannot_be_read_or_sent_arrives_as_a_placeholder():
    class Broken(torch.nn.Module):
        def state_dict(self, *args, **kwargs):
            raise RuntimeError("no")

    huge = torch.nn.ModuleList(torch.nn.Linear(1, 1) for _ in range(200))  # 400 entries
    for module, name in ((Broken(), "Broken"), (huge, "ModuleList")):
        received = roundtrip(module)
        assert type(received) is wire.Foreign and name in received.type_name


def test_a_forged_module_state_is_refused():
    with pytest.raises(wire.WireError, match="malformed"):
        wire.decode({"kind": "module", "type": "TinyLM", "state": {"kind": "list", "items": []}})
    with pytest.raises(wire.WireError, match="malformed"):
        wire.decode({"kind": "module", "type": "TinyLM", "state": "weights"})

def forged(tree: dict, data: bytes = b"") -> tuple[bytes, bytes]:
    text = json.dumps(tree).encode()
    return wire.HEADER.pack(len(text), len(data)), text + data


@pytest.mark.parametrize("tree, data", [
    ({"value": {"$tensor": 0, "dtype": "object", "shape": [1]}}, b"x" * 8),
    ({"value": {"$tensor": 0, "dtype": "torch.float32", "shape": [4]}}, b"x" * 8),
    ({"value": {"$tensor": 0, "dtype": "torch.float32", "shape": [-1]}}, b""),
    ({"value": {"$tensor": 0, "dtype": "torch.float32", "shape": "big"}}, b""),
], ids=["unknown-dtype", "too-few-bytes", "negative-size", "shape-not-a-list"])
def test_forged_tensors_are_refused(tree, data):
    with pytest.raises(wire.WireError):
        wire.load(*forged(tree, data))


def test_a_frame_that_is_not_json_is_refused():
    with pytest.raises(wire.WireError):
        wire.load(wire.HEADER.pack(5, 0), b"\x80\x04K\x01.")  # a pickle, not JSON


@pytest.mark.parametrize("node", [
    {"kind": "tensor", "data": "not a tensor", "device": "cpu"},
    {"kind": "python", "value": [1, 2]},
    {"kind": "mystery"},
    {"kind": "dict", "keys": ["a", "b"], "items": [{"kind": "python", "value": 1}]},
    ["not", "a", "dict"],
])
def test_malformed_descriptions_are_refused(node):
    with pytest.raises(wire.WireError):
        wire.decode(node)


def test_the_devices_of_returned_tensors_are_known():
    encoded = wire.encode((torch.zeros(2), [torch.ones(1), 3]))
    assert wire.devices(encoded) == {"cpu"}
    assert wire.devices(wire.encode("no tensor")) == set()


def test_a_tensor_on_another_device_than_the_inputs_fails():
    from grader.compare import CheckFailure
    from grader.remote_submission import _expect_device

    answer = {"kind": "tuple", "items": [{"kind": "tensor", "device": "cuda:0"}]}
    with pytest.raises(CheckFailure, match="returned a tensor on cuda:0 for inputs on cpu"):
        _expect_device("f(x (2,))", answer, "cpu")
    _expect_device("f(x (2,))", answer, "cuda")
