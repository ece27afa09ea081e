"""What crosses between the grader and a worker: data, never objects.

The worker (student code) turns whatever a function returned into a tree of
plain values: tensors, numbers, strings, lists and dicts, each tagged with
what it was, and a returned ``nn.Module`` into its type and ``state_dict``
(``encode``). A frame carries that tree as JSON, with each
tensor's bytes appended after it; reading a frame (``load``) parses JSON and
copies bytes into fresh tensors, and runs no pickle, so nothing the student
built (a tensor subclass that lies in ``__eq__``, an object "equal" to
everything) can reach the process that decides the grade. ``decode`` then
checks the tree's shape strictly. Requests to the worker use the same frames.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import torch

MAX_FRAME = 64 * 2**20  # bytes; a worker that sends more is stopped
MAX_ITEMS = 256  # a longer list or tuple is not sent, only its type and length
MAX_DEPTH = 6
MAX_TEXT = 500  # characters of a string or repr that are sent
MAX_PRINTED = 2000  # characters of what student code printed, sent from one call or the file's top level
HEADER = struct.Struct(">QQ")  # sizes of a frame's JSON part and of its tensor bytes
DTYPES = {str(dtype): dtype for dtype in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
    torch.bool)}
# The same dtypes in NumPy (all but bfloat16): bytes become arrays, and arrays
# tensors, without a torch operator, which a NumPy exercise's worker refuses.
NUMPY_DTYPES = {name: np.dtype(str(dtype).removeprefix("torch."))
                for name, dtype in DTYPES.items() if dtype != torch.bfloat16}
NUMPY_DTYPES["torch.bool"] = np.dtype(np.bool_)
_TORCH_NAMES = {dtype: name for name, dtype in NUMPY_DTYPES.items()}


class WireError(Exception):
    """A worker sent something that is not a well-formed answer."""


class Foreign:
    """Stands for a value that could not be sent as data (an object, a class,
    a generator...). Checks report its type; nothing else is known of it."""

    def __init__(self, type_name: str, text: str = ""):
        self.type_name = type_name
        self.text = text

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


class ModuleState(Foreign):
    """Stands for an ``nn.Module`` a function returned (a trained model, say):
    its type and its ``state_dict``, copied as tensors. The object itself
    stays in the worker; a check rebuilds what it needs from the state."""

    def __init__(self, type_name: str, state: dict):
        super().__init__(type_name)
        self.state = state


# -- frames, in both directions ---------------------------------------------


def dump(message: dict) -> bytes:
    """One frame: sizes, the JSON of ``message`` with each tensor replaced by
    a reference, then the tensors' bytes in order."""
    blobs: list[bytes] = []

    def plain(node):
        if isinstance(node, np.ndarray):  # an array travels as the tensor it would be
            blobs.append(np.ascontiguousarray(node).tobytes())
            return {"$tensor": len(blobs) - 1, "dtype": _TORCH_NAMES[node.dtype], "shape": list(node.shape)}
        if isinstance(node, torch.Tensor):
            tensor = node.detach().contiguous().cpu()
            if tensor.dtype == torch.bfloat16:  # no NumPy dtype: its bytes as int16
                tensor = tensor.view(torch.int16)
            blobs.append(tensor.numpy().tobytes())
            return {"$tensor": len(blobs) - 1, "dtype": str(node.dtype), "shape": list(tensor.shape)}
        if isinstance(node, dict):
            return {str(key): plain(value) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            return [plain(item) for item in node]
        return node

    text = json.dumps(plain(message)).encode()
    data = b"".join(blobs)
    return HEADER.pack(len(text), len(data)) + text + data


def load(header: bytes, payload: bytes) -> dict:
    """Rebuild a message from its frame; only JSON values and tensors come out."""
    text_size, _ = HEADER.unpack(header)
    try:
        tree = json.loads(payload[:text_size])
    except ValueError:
        raise WireError("unreadable answer") from None
    data = memoryview(payload)[text_size:]
    offset = 0

    def rebuild(node):
        nonlocal offset
        if isinstance(node, list):
            return [rebuild(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$tensor" not in node:
            return {key: rebuild(value) for key, value in node.items()}
        dtype, shape = DTYPES.get(node.get("dtype")), node.get("shape")
        if dtype is None or not isinstance(shape, list) or not all(
                type(size) is int and size >= 0 for size in shape):
            raise WireError("malformed tensor")
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if offset + size > len(data):
            raise WireError("malformed tensor")
        chunk, offset = bytearray(data[offset:offset + size]), offset + size
        if dtype == torch.bfloat16:
            return torch.frombuffer(chunk, dtype=dtype).reshape(shape) if size else torch.empty(shape, dtype=dtype)
        return torch.from_numpy(np.frombuffer(chunk, dtype=NUMPY_DTYPES[node["dtype"]]).reshape(shape))

    message = rebuild(tree)
    if type(message) is not dict:
        raise WireError("malformed answer")
    return message


# -- worker side ------------------------------------------------------------


def _type_name(value: object) -> str:
    kind = type(value)
    module = getattr(kind, "__module__", "")
    return kind.__qualname__ if module in ("builtins", None, "") else f"{module}.{kind.__qualname__}"


def _plain_tensor(value: torch.Tensor) -> torch.Tensor:
    """A detached copy of ``value`` as a plain CPU ``torch.Tensor``."""
    with torch._C.DisableTorchFunction():  # a subclass cannot intercept the copy
        tensor = torch.Tensor.as_subclass(value.detach(), torch.Tensor)
        if tensor.is_sparse:
            tensor = tensor.to_dense()
        return tensor.resolve_conj().resolve_neg().to("cpu", copy=True)


def encode(value: object, depth: int = 0) -> dict:
    """Describe ``value`` with plain data only (runs in the worker)."""
    if depth > MAX_DEPTH:
        return {"kind": "foreign", "type": _type_name(value), "text": "nested too deeply"}
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            return {"kind": "meta", "shape": list(value.shape), "dtype": str(value.dtype)}
        if str(value.dtype) not in DTYPES:
            return {"kind": "foreign", "type": f"tensor of dtype {value.dtype}", "text": ""}
        return {
            "kind": "tensor",
            "data": _plain_tensor(value),
            "device": str(value.device),
        }
    if isinstance(value, np.ndarray):
        if value.dtype.newbyteorder("=") not in _TORCH_NAMES:  # object arrays, float128...
            return {"kind": "foreign", "type": f"numpy.ndarray of dtype {value.dtype}", "text": ""}
        return {"kind": "ndarray", "data": np.array(value, dtype=value.dtype.newbyteorder("="), copy=True)}
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {"kind": "numpy_scalar", "value": value.item(), "dtype": str(value.dtype)}
    if value is None or type(value) in (bool, int, float):
        return {"kind": "python", "value": value}
    if isinstance(value, torch.dtype):  # an argument such as dtype=torch.float16
        return {"kind": "dtype", "value": str(value)}
    if type(value) is str:
        return {"kind": "python", "value": value[:MAX_TEXT]}
    if isinstance(value, (tuple, list)):  # a NamedTuple is a tuple: its items are what counts
        kind = "tuple" if isinstance(value, tuple) else "list"
        try:
            items = list(tuple.__iter__(value) if kind == "tuple" else list.__iter__(value))
        except BaseException:  # a subclass of the student's that breaks iteration
            items = None
        if items is None or len(items) > MAX_ITEMS:
            return {"kind": "foreign", "type": f"{_type_name(value)} of {len(items or ())} items", "text": ""}
        return {"kind": kind, "items": [encode(item, depth + 1) for item in items]}
    if isinstance(value, torch.nn.Module):
        return _encode_module(value, depth)
    if type(value) is dict and all(type(key) is str for key in value):
        if len(value) > MAX_ITEMS:
            return {"kind": "foreign", "type": f"dict of {len(value)} items", "text": ""}
        return {"kind": "dict", "keys": [key[:MAX_TEXT] for key in value],
                "items": [encode(item, depth + 1) for item in value.values()]}
    try:
        text = repr(value)[:MAX_TEXT]
    except BaseException:  # a broken __repr__ is the student's, not ours
        text = ""
    return {"kind": "foreign", "type": _type_name(value), "text": text}


def _encode_module(module: torch.nn.Module, depth: int) -> dict:
    """A module as its type and its ``state_dict`` (tensors by name)."""
    try:
        state = dict(module.state_dict())
    except BaseException:  # the student's module, the student's error: send what is known
        state = None
    if state is None or len(state) > MAX_ITEMS or not all(type(key) is str for key in state):
        return {"kind": "foreign", "type": _type_name(module), "text": ""}
    return {"kind": "module", "type": _type_name(module), "state": encode(state, depth + 1)}


# -- grader side ------------------------------------------------------------


def _field(node: dict, key: str, kinds: type | tuple[type, ...]):
    value = node.get(key)
    if not isinstance(value, kinds) or isinstance(value, torch.Tensor) and type(value) is not torch.Tensor:
        raise WireError(f"malformed answer: {key!r} of a {node.get('kind')!r} value")
    return value


def decode(node: object) -> object:
    """Rebuild a value from ``encode``'s description.

    Tensors come back on the CPU (``devices`` tells where they were); NumPy
    arrays come back as NumPy arrays.
    """
    if type(node) is not dict:
        raise WireError("malformed answer")
    kind = node.get("kind")
    if kind == "tensor":
        _field(node, "device", str)
        return _field(node, "data", torch.Tensor)
    if kind == "ndarray":
        data = node.get("data")
        if isinstance(data, np.ndarray):  # not sent yet: as encode made it
            return data
        return _field(node, "data", torch.Tensor).numpy()
    if kind == "numpy_scalar":
        return np.dtype(_field(node, "dtype", str)).type(_field(node, "value", (bool, int, float)))
    if kind == "python":
        value = node.get("value")
        if value is not None and type(value) not in (bool, int, float, str):
            raise WireError("malformed answer")
        return value
    if kind in ("tuple", "list"):
        items = [decode(item) for item in _field(node, "items", list)]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        keys, items = _field(node, "keys", list), _field(node, "items", list)
        if len(keys) != len(items) or not all(type(key) is str for key in keys):
            raise WireError("malformed answer: a dict's keys")
        return {key: decode(item) for key, item in zip(keys, items)}
    if kind == "dtype":
        dtype = DTYPES.get(node.get("value"))
        if dtype is None:
            raise WireError("malformed answer: unknown dtype")
        return dtype
    if kind == "meta":
        return Foreign("tensor on the meta device (a shape, no values)", f"shape {tuple(_field(node, 'shape', list))}")
    if kind == "foreign":
        return Foreign(_field(node, "type", str), _field(node, "text", str))
    if kind == "module":
        state = decode(_field(node, "state", dict))
        if type(state) is not dict:
            raise WireError("malformed answer: a module's state")
        return ModuleState(_field(node, "type", str), state)
    raise WireError(f"malformed answer: unknown kind {kind!r}")


def devices(node: object) -> set[str]:
    """The devices of the tensors in an encoded value: ``{"cuda:0"}``."""
    found = set()
    if isinstance(node, dict):
        if node.get("kind") == "tensor":
            found.add(str(node.get("device")))
        elif node.get("kind") == "meta":
            found.add("meta")
        for item in node.get("items") or ():
            found |= devices(item)
        if node.get("kind") == "module":  # a returned model's parameters
            found |= devices(node.get("state"))
    return found


def flatten(value: object):
    """The items of nested tuples, lists and dict values (of a call's
    arguments or answer, in the worker)."""
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from flatten(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from flatten(item)
    else:
        yield value
