"""Only plain data crosses from a worker to the grader."""

import io
import pickle

import numpy as np
import pytest
import torch

from grader import wire


def roundtrip(value):
    frame = wire.dump({"value": wire.encode(value)})
    return wire.decode(wire.load(frame[wire.HEADER.size:])["value"])


def test_tensors_arrays_and_containers_survive():
    value = (torch.arange(6.0).view(2, 3), np.ones((2, 2), dtype=np.float32), [1, 2.5, None, "x"])
    tensor, array, items = roundtrip(value)
    assert type(tensor) is torch.Tensor and torch.equal(tensor, value[0])
    assert isinstance(array, np.ndarray) and array.dtype == np.float32
    assert items == [1, 2.5, None, "x"]


def test_views_are_sent_alone_not_with_their_storage():
    big = torch.zeros(1000, 1000)
    frame = wire.dump({"value": wire.encode(big[:2, :2])})
    assert len(frame) < 10_000


def test_a_tensor_subclass_arrives_as_a_plain_tensor():
    class Liar(torch.Tensor):
        def __eq__(self, other):
            return True

    sent = torch.zeros(3).as_subclass(Liar)
    received = roundtrip(sent)
    assert type(received) is torch.Tensor
    assert not torch.equal(received, torch.ones(3))


def test_objects_arrive_as_foreign_placeholders():
    class Anything:
        def __eq__(self, other):
            return True

    received = roundtrip(Anything())
    assert isinstance(received, wire.Foreign)
    assert received != 1 and "Anything" in received.type_name


def test_arbitrary_pickles_are_refused():
    class Boom:
        def __reduce__(self):
            return (print, ("this must never run",))

    payload = pickle.dumps({"value": Boom()}, protocol=2)
    with pytest.raises(wire.WireError):
        wire.load(payload)


@pytest.mark.parametrize("node", [
    {"kind": "tensor", "data": "not a tensor", "device": "cpu"},
    {"kind": "python", "value": [1, 2]},
    {"kind": "mystery"},
    ["not", "a", "dict"],
])
def test_malformed_descriptions_are_refused(node):
    with pytest.raises(wire.WireError):
        wire.decode(node)


class Sneaky(torch.Tensor):
    """A subclass a worker might try to send as it is."""


def test_a_torch_save_of_a_subclass_is_refused():
    buffer = io.BytesIO()
    torch.save({"value": torch.zeros(2).as_subclass(Sneaky)}, buffer)
    with pytest.raises(wire.WireError):
        wire.load(buffer.getvalue())
