"""What a recording keeps of a call and its answer (``grader.recorded``):
the call's key, a digest of the call; answers as plain data trees, which
``grader.wire`` saves; and a known bug's large floating-point output as a
``Fingerprint`` that tells whether a student's answer matches it.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import fields, is_dataclass

import numpy as np
import torch

from grader import wire

# A bug's output is kept whole up to this many entries, and always when it is
# not floating point (masks and indices must match exactly, and some checks
# compute with a bug's mask); larger float outputs become fingerprints.
WHOLE_UP_TO = 128
PROJECTIONS = 6  # random +-1 projections of a fingerprint
SAMPLES = 24  # entries a fingerprint keeps exactly


# -- the key of a call ------------------------------------------------------------------


def digest(*parts: object) -> str:
    """A canonical digest of a call: tensors and arrays by dtype, shape and
    bytes, plain values by type and value, containers item by item."""
    hasher = hashlib.blake2b(digest_size=16)
    _feed(hasher, parts)
    return hasher.hexdigest()


def _feed(hasher, value: object) -> None:
    def put(tag: str, payload: bytes = b"") -> None:
        # Length-prefixed, so that no two different values feed the same bytes.
        hasher.update(tag.encode() + struct.pack(">Q", len(payload)) + payload)

    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        put("tensor", f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        put("bytes", tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        put("ndarray", f"{array.dtype}{array.shape}".encode())
        put("bytes", array.tobytes())
    elif value is None or type(value) in (bool, int, float, str):
        put(type(value).__name__, repr(value).encode())
    elif isinstance(value, np.generic):
        put("numpy", f"{value.dtype}:{value.item()!r}".encode())
    elif isinstance(value, torch.dtype):
        put("dtype", str(value).encode())
    elif isinstance(value, torch.device):
        put("device", str(value).encode())
    elif isinstance(value, (tuple, list)):
        put(type(value).__name__, str(len(value)).encode())
        for item in value:
            _feed(hasher, item)
    elif isinstance(value, dict):
        put("dict", str(len(value)).encode())
        for key in sorted(value, key=str):  # keyword order does not change a call
            _feed(hasher, str(key))
            _feed(hasher, value[key])
    elif is_dataclass(value) and not isinstance(value, type):  # a ModuleCall recipe
        put(type(value).__name__)
        _feed(hasher, {field.name: getattr(value, field.name) for field in fields(value)})
    else:
        raise TypeError(f"cannot record an argument of type {type(value).__name__}")


# -- values as plain data ---------------------------------------------------------------


def plain(value: object) -> object:
    """A recorded value as a tree ``wire.dump`` writes (tensors stay tensors)."""
    if isinstance(value, torch.Tensor):
        return {"t": value.detach().cpu().contiguous().clone()}
    if isinstance(value, np.ndarray):
        return {"a": torch.from_numpy(np.array(value, copy=True))}
    if isinstance(value, Fingerprint):
        return {"f": value.plain()}
    if value is None or type(value) in (bool, int, float, str):
        return {"v": value}
    if isinstance(value, torch.dtype):
        return {"d": str(value)}
    if isinstance(value, (tuple, list)):
        return {"tuple" if isinstance(value, tuple) else "list": [plain(item) for item in value]}
    if isinstance(value, dict) and all(type(key) is str for key in value):
        return {"dict": {key: plain(item) for key, item in value.items()}}
    raise TypeError(f"cannot record a value of type {type(value).__name__}")


def value_of(node: dict) -> object:
    """The value ``plain`` wrote, fresh (the caller may change it in place)."""
    (kind, item), = node.items()
    if kind == "t":
        return item.clone()
    if kind == "a":
        return item.numpy().copy()
    if kind == "f":
        return Fingerprint.from_plain(item)
    if kind == "v":
        return item
    if kind == "d":
        return wire.DTYPES[item]
    if kind in ("tuple", "list"):
        items = [value_of(child) for child in item]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {key: value_of(child) for key, child in item.items()}
    raise ValueError(f"unknown recorded value {kind!r}")


def equal(a: object, b: object) -> bool:
    """Exactly the same value (NaN equal to NaN), container by container."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(equal(x, y) for x, y in zip(a, b)))
    if isinstance(a, dict) or isinstance(b, dict):
        return (type(a) is type(b) and list(a) == list(b)
                and all(equal(a[key], b[key]) for key in a))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_floating_point() or a.is_complex():
            return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
        return torch.equal(a, b)
    if isinstance(a, (torch.Tensor, np.ndarray)) or isinstance(b, (torch.Tensor, np.ndarray)):
        return False
    return type(a) is type(b) and a == b


# -- fingerprints of known bugs' outputs ------------------------------------------------


def _probes(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed +-1 projections and sample positions for ``count`` entries:
    drawn from a generator seeded by the size, so recording and replay agree."""
    generator = torch.Generator().manual_seed(1_000_003 * count + 17)
    signs = torch.randint(0, 2, (PROJECTIONS, count), generator=generator, dtype=torch.int8)
    samples = torch.randperm(count, generator=generator)[:SAMPLES]
    return signs.to(torch.float64) * 2 - 1, samples


def _nonfinite(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the entries are not finite, and which they are (0 NaN, 1 +inf, 2 -inf)."""
    where = torch.nonzero(~torch.isfinite(flat)).flatten()
    bad = flat[where]
    kinds = torch.where(torch.isnan(bad), 0, torch.where(bad > 0, 1, 2)).to(torch.int8)
    return where, kinds


class Fingerprint:
    """What the edition keeps of a large floating-point output of a known bug.

    ``matched_by(got)`` is the edition's ``compare.matches(got, output)``: it
    needs the same kind (tensor or array), shape and dtype, the same NaN and
    inf entries, and, with compare's tolerance for the dtype, (1) each kept
    sample entry within tolerance and (2) each projection within the bound
    that elementwise closeness implies: ``|p . (got - out)| <= sum(atol +
    rtol |out|)`` over the finite entries. An answer that compare matches is
    always matched here; an answer matched here differs from the output by
    no more than tolerance in the sampled entries and on average overall.
    """

    def __init__(self, shape, dtype: torch.dtype, numpy: bool, nonfinite, kinds,
                 projections, abs_sum: float, samples):
        self.shape, self.dtype, self.numpy = tuple(shape), dtype, numpy
        self.nonfinite, self.kinds = nonfinite, kinds
        self.projections, self.abs_sum, self.samples = projections, abs_sum, samples

    @classmethod
    def of(cls, output: torch.Tensor | np.ndarray) -> Fingerprint:
        numpy = isinstance(output, np.ndarray)
        tensor = torch.from_numpy(np.asarray(output)) if numpy else output.detach().cpu()
        flat = tensor.reshape(-1)
        nonfinite, kinds = _nonfinite(flat)
        finite = torch.where(torch.isfinite(flat), flat, torch.zeros_like(flat)).double()
        signs, samples = _probes(flat.numel())
        return cls(tensor.shape, tensor.dtype, numpy, nonfinite, kinds, signs @ finite,
                   float(finite.abs().sum()), flat[samples].clone())

    def __getitem__(self, index):  # a check that slices a bug's output skips this bug
        raise TypeError("a fingerprint of a known bug's output cannot be sliced")

    def matched_by(self, got: object) -> bool:
        from grader.compare import _tolerance, close_mask

        if isinstance(got, np.ndarray) != self.numpy or not isinstance(got, (np.ndarray, torch.Tensor)):
            return False
        tensor = torch.from_numpy(np.asarray(got)) if self.numpy else got.detach().cpu()
        if tuple(tensor.shape) != self.shape or tensor.dtype != self.dtype:
            return False
        flat = tensor.reshape(-1)
        nonfinite, kinds = _nonfinite(flat)
        if not (torch.equal(nonfinite, self.nonfinite) and torch.equal(kinds, self.kinds)):
            return False
        rtol, atol = _tolerance(self.dtype)
        signs, samples = _probes(flat.numel())
        if not bool(close_mask(flat[samples], self.samples, rtol, atol, equal_nan=True).all()):
            return False
        finite = torch.where(torch.isfinite(flat), flat, torch.zeros_like(flat)).double()
        count = flat.numel() - self.nonfinite.numel()
        bound = count * atol + rtol * self.abs_sum
        # float64 sums of float32 values: allow their rounding, nothing more.
        rounding = 1e-12 * (float(finite.abs().sum()) + self.abs_sum)
        return bool(((signs @ finite - self.projections).abs() <= bound + rounding).all())

    def plain(self) -> dict:
        return {"shape": list(self.shape), "dtype": str(self.dtype), "numpy": self.numpy,
                "nonfinite": self.nonfinite, "kinds": self.kinds, "projections": self.projections,
                "abs_sum": self.abs_sum, "samples": self.samples}

    @classmethod
    def from_plain(cls, node: dict) -> Fingerprint:
        return cls(node["shape"], wire.DTYPES[node["dtype"]], node["numpy"], node["nonfinite"],
                   node["kinds"], node["projections"], node["abs_sum"], node["samples"])


def compacted(output: object) -> object:
    """A bug's output as the edition keeps it: large float arrays fingerprinted."""
    if isinstance(output, (tuple, list)):
        return type(output)(compacted(item) for item in output)
    if isinstance(output, (torch.Tensor, np.ndarray)):
        tensor = torch.from_numpy(np.asarray(output)) if isinstance(output, np.ndarray) else output
        # Half precision is kept whole: its loose tolerance would make a
        # fingerprint's bound loose too (and its outputs are half the size).
        if (tensor.is_floating_point() and tensor.numel() > WHOLE_UP_TO
                and tensor.dtype not in (torch.float16, torch.bfloat16)):
            return Fingerprint.of(output)
    return output
