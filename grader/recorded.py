"""Recorded expectations: grading without the reference solutions.

The student edition (``mha-course release``) ships the checks but not
``solutions/``. What a check asks of the reference is recorded instead:
``mha-course release`` grades the reference solutions once per recorded seed,
and every call a check makes to ``reference.<function>(...)`` (or, through
``reference_module_call``, to one of its classes) is stored with its answer,
keyed by a digest of the call; so is every call a check makes to an
independent oracle (``grader.oracles``, which the edition leaves out too).
The checks' inputs depend only on the seed and
the check (``grader.inputs``), so a grade in the edition with a recorded seed
makes the very same calls and finds every answer here.

Known-bug hints are recorded too, but not as the bugs' outputs (megabytes):
each large floating-point output is kept as a ``Fingerprint`` that can tell
whether a student's answer matches it, and small or exact outputs (masks,
counts) are kept whole, since some checks compute with them.

Three modes, chosen once: ``MODE`` is None in the instructor's tree (the
fixtures use the real solutions and nothing here runs), a ``Replayer`` in an
edition (no ``solutions/``, recordings present), and a ``Recorder`` only while
``release`` records.

Files: ``grader/recorded/index.json`` (format, seeds) and one
``grader/recorded/chNN.rec`` a chapter: a zlib-compressed ``grader.wire``
frame (JSON and raw tensor bytes). Loading parses JSON and copies bytes into
tensors; no pickle runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path

import numpy as np
import torch

from grader import wire
from grader.catalog import COURSE_ROOT, Chapter, is_student_edition

FORMAT = 1
RECORDED_DIR = Path(__file__).resolve().parent / "recorded"
INDEX = "index.json"

# A bug's output is kept whole up to this many entries, and always when it is
# not floating point (masks and indices must match exactly, and some checks
# compute with a bug's mask); larger float outputs become fingerprints.
WHOLE_UP_TO = 128
PROJECTIONS = 6  # random +-1 projections of a fingerprint
SAMPLES = 24  # entries a fingerprint keeps exactly


class NotRecorded(LookupError):
    """A check asked the reference something the edition did not record."""


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


def _plain(value: object) -> object:
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
        return {"tuple" if isinstance(value, tuple) else "list": [_plain(item) for item in value]}
    if isinstance(value, dict) and all(type(key) is str for key in value):
        return {"dict": {key: _plain(item) for key, item in value.items()}}
    raise TypeError(f"cannot record a value of type {type(value).__name__}")


def _value(node: dict) -> object:
    """The value ``_plain`` wrote, fresh (the caller may change it in place)."""
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
        items = [_value(child) for child in item]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {key: _value(child) for key, child in item.items()}
    raise ValueError(f"unknown recorded value {kind!r}")


def _equal(a: object, b: object) -> bool:
    """Exactly the same value (NaN equal to NaN), container by container."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(_equal(x, y) for x, y in zip(a, b)))
    if isinstance(a, dict) or isinstance(b, dict):
        return (type(a) is type(b) and list(a) == list(b)
                and all(_equal(a[key], b[key]) for key in a))
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


def _compact(output: object) -> object:
    """A bug's output as the edition keeps it: large float arrays fingerprinted."""
    if isinstance(output, (tuple, list)):
        return type(output)(_compact(item) for item in output)
    if isinstance(output, (torch.Tensor, np.ndarray)):
        tensor = torch.from_numpy(np.asarray(output)) if isinstance(output, np.ndarray) else output
        # Half precision is kept whole: its loose tolerance would make a
        # fingerprint's bound loose too (and its outputs are half the size).
        if (tensor.is_floating_point() and tensor.numel() > WHOLE_UP_TO
                and tensor.dtype not in (torch.float16, torch.bfloat16)):
            return Fingerprint.of(output)
    return output


# -- what one chapter recorded ----------------------------------------------------------


class Recording:
    """One chapter's recorded answers.

    Values are kept as plain trees (``_plain``), as they are saved.
    ``answers``: digest of a call -> the reference's answer.
    ``lookalikes``: digest of a call -> ``[[bug indices, compact output]]``
    in the order ``Lookalikes`` yields them; bugs whose outputs are equal
    share one entry, and bugs whose output is the reference's are left out
    (an answer that differs from the reference cannot match them).
    """

    def __init__(self, answers: dict | None = None, lookalikes: dict | None = None):
        self.answers = answers if answers is not None else {}
        self.lookalikes = lookalikes if lookalikes is not None else {}

    def to_bytes(self) -> bytes:
        tree = {"format": FORMAT, "answers": self.answers, "lookalikes": self.lookalikes}
        return zlib.compress(wire.dump(tree), 9)

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "recording") -> Recording:
        frame = zlib.decompress(data)
        tree = wire.load(frame[:wire.HEADER.size], frame[wire.HEADER.size:])
        if tree.get("format") != FORMAT:
            raise ValueError(f"{name}: recorded in format {tree.get('format')}, "
                             f"this grader reads format {FORMAT}")
        # Values are rebuilt call by call (``_value``), when a check asks.
        return cls(tree["answers"], tree["lookalikes"])

    def save(self, path: Path) -> int:
        data = self.to_bytes()
        path.write_bytes(data)
        return len(data)

    @classmethod
    def load(cls, path: Path) -> Recording:
        return cls.from_bytes(path.read_bytes(), path.name)


# -- recording (mha-course release) ------------------------------------------------------


class Recorder:
    """The fixtures' mode while ``release`` grades the reference solutions:
    the real reference and bugs, with every call written down."""

    def __init__(self):
        self.recordings: dict[str, Recording] = {}

    def recording(self, chapter: Chapter) -> Recording:
        return self.recordings.setdefault(chapter.id, Recording())

    def reference(self, chapter: Chapter, check: str, load: Callable[[Chapter], object]):
        return RecordingReference(load(chapter), chapter, self.recording(chapter))

    def bugs(self, chapter: Chapter, check: str, load: Callable[[Chapter], object], seen=()):
        from grader.known_bugs import KnownBugs

        return RecordingBugs(chapter, self.recording(chapter), load(chapter), KnownBugs(chapter, seen))

    def seed(self, seed: int | None) -> int | None:
        return seed

    def oracle(self, chapter: Chapter, name: str, args: tuple, kwargs: dict):
        """An oracle's answer, computed and written down."""
        answer = live_oracle(chapter, name)(*args, **kwargs)
        self.recording(chapter).answers[digest(chapter.id, ORACLE + name, args, kwargs, None)] = _plain(answer)
        return answer


class RecordingReference:
    """The reference module, answering as usual and recording each answer."""

    def __init__(self, module, chapter: Chapter, recording: Recording):
        self._module, self._chapter, self._recording = module, chapter, recording

    def __getattr__(self, name: str):
        function = getattr(self._module, name)
        if not callable(function):
            raise TypeError(f"reference.{name} is not a function: the edition records calls only")

        def call(*args, **kwargs):
            key = digest(self._chapter.id, name, args, kwargs, None)
            answer = function(*args, **kwargs)
            self._recording.answers[key] = _plain(answer)
            return answer
        return call

    def module_call(self, name: str, recipe, args, kwargs):
        from grader.module_calls import run_module_call

        answer = run_module_call(self._module, name, recipe, args, kwargs)
        self._recording.answers[digest(self._chapter.id, name, tuple(args), kwargs, recipe)] = _plain(answer)
        return answer


class RecordingBugs:
    """The ``bugs`` fixture while recording: every ``Lookalikes`` a check
    makes is run at once (its inputs are known when it is made; the student
    edition cannot run the bugs later) and kept in compact form."""

    def __init__(self, chapter: Chapter, recording: Recording, reference, real):
        self._chapter, self._recording, self._reference, self._real = chapter, recording, reference, real

    def module(self, name: str, recipe, *args, **kwargs):
        self._record(name, args, kwargs, recipe)
        return self._real.module(name, recipe, *args, **kwargs)

    def __getattr__(self, function: str):
        if function.startswith("_"):
            raise AttributeError(function)

        def make(*args, **kwargs):
            self._record(function, args, kwargs, None)
            return getattr(self._real, function)(*args, **kwargs)
        return make

    def _record(self, function: str, args: tuple, kwargs: dict, recipe) -> None:
        from grader.known_bugs import KNOWN_BUGS, Lookalikes, run_module_call

        key = digest(self._chapter.id, function, args, kwargs, recipe)
        if key in self._recording.lookalikes:
            return
        try:  # the right answer, to leave out the bugs that give it
            right = (run_module_call(self._reference, function, recipe, _cloned(args), _cloned(kwargs))
                     if recipe is not None else
                     getattr(self._reference, function)(*_cloned(args), **_cloned(kwargs)))
        except Exception:
            right = _NOTHING
        entries: list[tuple[list[int], object, object]] = []
        lookalikes = Lookalikes(self._chapter, function, args, kwargs, module=recipe)
        for bug, output in lookalikes.outputs_by_bug():
            if right is not _NOTHING and _equal(output, right):
                continue
            index = KNOWN_BUGS[self._chapter.id].index(bug)
            # Bugs with equal outputs share one entry, at the first one's
            # place: the first bug whose output an answer matches is the
            # same either way, so the hint is too.
            same = next((entry for entry in entries if _equal(entry[2], output)), None)
            if same is not None:
                same[0].append(index)
            else:
                entries.append(([index], _compact(output), output))
        self._recording.lookalikes[key] = [[indices, _plain(compact)] for indices, compact, _ in entries]


_NOTHING = object()


def _cloned(values):
    from grader.known_bugs import _cloned as cloned

    return cloned(values)


# -- replay (the student edition) -------------------------------------------------------


class Replayer:
    """The fixtures' mode in the student edition: answers come from the
    recordings; a call that was not recorded is a grader error naming the
    check, never a pass."""

    def __init__(self, folder: Path = RECORDED_DIR):
        self.folder = folder
        index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
        if index.get("format") != FORMAT:
            raise ValueError(f"recordings in format {index.get('format')}; this grader reads {FORMAT}")
        self.seeds: list[int] = [int(seed) for seed in index["seeds"]]
        self._recordings: dict[str, Recording] = {}

    def recording(self, chapter: Chapter) -> Recording:
        if chapter.id not in self._recordings:
            path = self.folder / f"{chapter.id}.rec"
            self._recordings[chapter.id] = Recording.load(path) if path.exists() else Recording()
        return self._recordings[chapter.id]

    def reference(self, chapter: Chapter, check: str, load=None):
        return ReplayReference(chapter, check, self.recording(chapter))

    def bugs(self, chapter: Chapter, check: str, load=None, seen=()):
        return ReplayBugs(chapter, self.recording(chapter), seen)

    def oracle(self, chapter: Chapter, name: str, args: tuple, kwargs: dict):
        """An oracle's recorded answer."""
        node = self.recording(chapter).answers.get(digest(chapter.id, ORACLE + name, args, kwargs, None))
        if node is None:
            raise NotRecorded(f"a check asked the oracle {name} for a call that mha-course release "
                              "did not record")
        return _value(node)

    def seed(self, seed: int | None) -> int:
        """The seed a grade uses: one that was recorded."""
        if seed is None:
            return secrets.choice(self.seeds)
        if seed not in self.seeds:
            raise ValueError(f"--seed {seed} was not recorded in this edition of the course; "
                             f"use one of {', '.join(map(str, self.seeds))}, or no --seed")
        return seed


class ReplayReference:
    """The ``reference`` fixture in the edition: same calls, recorded answers."""

    def __init__(self, chapter: Chapter, check: str, recording: Recording):
        self._chapter, self._check, self._recording = chapter, check, recording

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._answer(name, args, kwargs, None)

    def module_call(self, name: str, recipe, args, kwargs):
        return self._answer(name, tuple(args), kwargs, recipe)

    def _answer(self, name: str, args: tuple, kwargs: dict, recipe):
        node = self._recording.answers.get(digest(self._chapter.id, name, args, kwargs, recipe))
        if node is None:
            raise NotRecorded(f"check {self._check} asked the reference for a call of {name} "
                              "that mha-course release did not record")
        return _value(node)


class ReplayBugs:
    """The ``bugs`` fixture in the edition: recorded lookalikes, or none."""

    def __init__(self, chapter: Chapter, recording: Recording, seen=()):
        self._chapter, self._recording, self._seen = chapter, recording, seen

    def module(self, name: str, recipe, *args, **kwargs):
        return ReplayLookalikes(self._chapter, self._recording,
                                digest(self._chapter.id, name, args, kwargs, recipe), self._seen)

    def __getattr__(self, function: str):
        if function.startswith("_"):
            raise AttributeError(function)
        return lambda *args, **kwargs: ReplayLookalikes(
            self._chapter, self._recording, digest(self._chapter.id, function, args, kwargs, None), self._seen)


class ReplayLookalikes:
    """``Lookalikes`` from a recording: the same interface, the same order.
    A call that was not recorded (its inputs came from the student's own
    answer) has no lookalikes: hints are a help, never part of a verdict."""

    def __init__(self, chapter: Chapter, recording: Recording, key: str, seen=()):
        self._chapter, self._recording, self._key, self._seen = chapter, recording, key, seen

    def __call__(self) -> Iterator[tuple[str, object]]:
        return self._outputs(None)

    def part(self, index: int):
        return lambda: self._outputs(index)

    def _outputs(self, index: int | None) -> Iterator[tuple[str, object]]:
        from grader.known_bugs import KNOWN_BUGS, seen_first

        bugs = KNOWN_BUGS.get(self._chapter.id, ())
        # One (bug, output) pair per bug, in the recorded order, then the
        # bugs seen earlier in the run first, as Lookalikes orders them.
        pairs = [(bug, node) for indices, node in self._recording.lookalikes.get(self._key, ())
                 for bug in indices]
        for bug, node in seen_first(pairs, lambda pair: bugs[pair[0]].hint, self._seen):
            output = _value(node)
            if index is not None:
                try:
                    output = output[index]
                except (TypeError, IndexError):  # as Lookalikes: an output without that part
                    continue
            yield bugs[bug].hint, output


# -- oracles ----------------------------------------------------------------------------

# An oracle's calls are keyed apart from the reference's functions of the same name.
ORACLE = "oracle:"


def live_oracle(chapter: Chapter, name: str) -> Callable:
    """The function ``name`` of ``grader/oracles/chNN.py`` (instructor's tree only)."""
    import importlib

    return getattr(importlib.import_module(f"grader.oracles.{chapter.id}"), name)


def oracle_answer(chapter: Chapter, name: str, args: tuple, kwargs: dict):
    """What the oracle ``name`` answers to a call: computed in the
    instructor's tree, computed and recorded while ``release`` records,
    recorded in the student edition."""
    if MODE is None:
        return live_oracle(chapter, name)(*args, **kwargs)
    return MODE.oracle(chapter, name, args, kwargs)


# -- the mode ---------------------------------------------------------------------------


def is_edition(root: Path = COURSE_ROOT) -> bool:
    """A student edition: recordings and no reference solutions."""
    return is_student_edition(root)


MODE: Recorder | Replayer | None = Replayer() if is_edition() else None


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    """Grades inside this block record what the checks ask of the reference."""
    global MODE
    previous, MODE = MODE, Recorder()
    try:
        yield MODE
    finally:
        MODE = previous


