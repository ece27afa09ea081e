"""Recorded expectations: grading without the reference solutions.

The student edition (``mha-course release``) ships the checks but not
``solutions/``. What a check asks of the reference is recorded instead:
``mha-course release`` grades the reference solutions once per recorded seed,
and every call a check makes to ``reference.<function>(...)`` (or, through
``reference_module_call``, to one of its classes) is stored with its answer,
keyed by a digest of the call; so is every call a check makes to an
independent oracle (each chapter's ``oracles.py``, which the edition leaves out too).
The checks' inputs depend only on the seed and
the check (``grader.inputs``), so a grade in the edition with a recorded seed
makes the very same calls and finds every answer here.

Known-bug hints are recorded too, but not as the bugs' outputs (megabytes):
each large floating-point output is kept as a ``Fingerprint`` that can tell
whether a student's answer matches it, and small or exact outputs (masks,
counts) are kept whole, since some checks compute with them.

Three modes, one a grade, handed to ``grading.grade`` by whoever grades
(``tree_mode`` when it names none): ``Live`` in the instructor's tree (the
fixtures use the real solutions and nothing is recorded), a ``Replayer`` in
an edition (no ``solutions/``, recordings present), and a ``Recorder`` only
while ``release`` records. No module holds the mode: two grades in one
process may grade two ways.

Files: ``grader/recorded/index.json`` (format, seeds) and one
``grader/recorded/chNN.rec`` a chapter: a zlib-compressed ``grader.wire``
frame (JSON and raw tensor bytes). Loading parses JSON and copies bytes into
tensors; no pickle runs.
"""

from __future__ import annotations

import functools
import json
import secrets
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from grader import wire
from grader.catalog import Chapter, is_student_edition
from grader.compare import Raised
from grader.recorded_values import compacted, digest, equal, plain, value_of

# 2: a lookalike may be a combination of bugs, recorded as the list of their indices.
# 3: or a relation's variant of the call (``relations.Variant``), as {"relation", "hint"}
#    (an edit of the reference, ``grader.edits``, too: its relation is "edit").
# 4: and "raised": digest of a call -> [[hint, what it raised]], the edits of the reference
#    (``grader.edits``) that raise on its inputs, for a submission that raises there too.
FORMAT = 4
RECORDED_DIR = Path(__file__).resolve().parent / "recorded"
INDEX = "index.json"

class NotRecorded(LookupError):
    """A check asked the reference something the edition did not record."""


# -- what one chapter recorded ----------------------------------------------------------


class Recording:
    """One chapter's recorded answers.

    Values are kept as plain trees (``recorded_values.plain``), as they are saved.
    ``answers``: digest of a call -> the reference's answer.
    ``raised``: digest of a call -> ``[[hint, what it raised]]`` of the
    edits of the reference that raise on its inputs (``raising``).
    ``lookalikes``: digest of a call -> ``[[bug indices, compact output]]``
    in the order ``Lookalikes`` yields them (a combination of bugs is the
    list of its bugs' indices in place of one index); bugs whose outputs are equal
    share one entry, and bugs whose output is the reference's are left out
    (an answer that differs from the reference cannot match them).
    """

    def __init__(self, answers: dict | None = None, lookalikes: dict | None = None, raised: dict | None = None):
        self.answers = answers if answers is not None else {}
        self.lookalikes = lookalikes if lookalikes is not None else {}
        self.raised = raised if raised is not None else {}

    def to_bytes(self) -> bytes:
        tree = {"format": FORMAT, "answers": self.answers, "lookalikes": self.lookalikes, "raised": self.raised}
        return zlib.compress(wire.dump(tree), 9)

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "recording") -> Recording:
        frame = zlib.decompress(data)
        tree = wire.load(frame[:wire.HEADER.size], frame[wire.HEADER.size:])
        if tree.get("format") != FORMAT:
            raise ValueError(f"{name}: recorded in format {tree.get('format')}, "
                             f"this grader reads format {FORMAT}")
        # Values are rebuilt call by call (``recorded_values.value_of``), when a check asks.
        return cls(tree["answers"], tree["lookalikes"], tree["raised"])

    def save(self, path: Path) -> int:
        data = self.to_bytes()
        path.write_bytes(data)
        return len(data)

    @classmethod
    def load(cls, path: Path) -> Recording:
        return cls.from_bytes(path.read_bytes(), path.name)


# -- the instructor's tree ---------------------------------------------------------------


class Live:
    """The fixtures' mode in the instructor's tree: the real reference,
    known bugs and oracles, nothing recorded."""

    def reference(self, chapter: Chapter, check: str, load: Callable[[Chapter], object]):
        return load(chapter)

    def bugs(self, chapter: Chapter, check: str, load: Callable[[Chapter], object], seen=()):
        from grader.known_bugs import LiveBugs

        return LiveBugs(chapter, seen)

    def seed(self, seed: int | None) -> int | None:
        return seed

    def raising(self, chapter: Chapter, call: Raised, seen=()) -> list[tuple[str, str]]:
        """``(hint, what it raised)`` of each edit of the reference that
        raises on the inputs of ``call`` (``known_bugs.Lookalikes.raised_by_edits``)."""
        return live_raising(chapter, call, seen)

    def oracle(self, chapter: Chapter, name: str, args: tuple, kwargs: dict):
        """An oracle's answer, computed."""
        return live_oracle(chapter, name)(*args, **kwargs)


# -- recording (mha-course release) ------------------------------------------------------


class Recorder:
    """The fixtures' mode while ``release`` grades the reference solutions:
    the real reference and bugs, with every call written down."""

    def __init__(self):
        self.recordings: dict[str, Recording] = {}
        self._submitted: dict[str, dict[str, Raised]] = {}  # chapter -> digest -> a call of the submission

    def recording(self, chapter: Chapter) -> Recording:
        return self.recordings.setdefault(chapter.id, Recording())

    def reference(self, chapter: Chapter, check: str, load: Callable[[Chapter], object]):
        return RecordingReference(load(chapter), chapter, self.recording(chapter))

    def bugs(self, chapter: Chapter, check: str, load: Callable[[Chapter], object], seen=()):
        from grader.known_bugs import LiveBugs

        return RecordingBugs(chapter, self.recording(chapter), load(chapter), LiveBugs(chapter, seen))

    def seed(self, seed: int | None) -> int | None:
        return seed

    def raising(self, chapter: Chapter, call: Raised, seen=()) -> list[tuple[str, str]]:
        return live_raising(chapter, call, seen)

    def submitted(self, chapter: Chapter, function: str, args: tuple, kwargs: dict, module) -> None:
        """Note a call the checks make of the submission: what each edit of
        the reference raises on its inputs is recorded (``record_raised``)
        for ``Replayer.raising``, which matches a student's error against it."""
        from grader.known_bugs import _cloned

        key = digest(chapter.id, function, args, kwargs, module)
        self._submitted.setdefault(chapter.id, {}).setdefault(
            key, Raised(function, _cloned(args), _cloned(kwargs), module, ""))

    def record_raised(self, chapter: Chapter) -> None:
        """What the edits raise on each noted call's inputs, once the
        chapter's checks have run: a call whose known bugs' lookalikes were
        recorded has it already (``RecordingBugs``)."""
        recording = self.recording(chapter)
        for key, call in self._submitted.pop(chapter.id, {}).items():
            if key not in recording.raised:
                recording.raised[key] = [[str(hint), text] for hint, text in live_raising(chapter, call)]

    def oracle(self, chapter: Chapter, name: str, args: tuple, kwargs: dict):
        """An oracle's answer, computed and written down."""
        answer = live_oracle(chapter, name)(*args, **kwargs)
        self.recording(chapter).answers[digest(chapter.id, ORACLE + name, args, kwargs, None)] = plain(answer)
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
            self._recording.answers[key] = plain(answer)
            return answer
        return call

    def module_call(self, name: str, recipe, args, kwargs):
        from grader.module_calls import run_module_call

        answer = run_module_call(self._module, name, recipe, args, kwargs)
        self._recording.answers[digest(self._chapter.id, name, tuple(args), kwargs, recipe)] = plain(answer)
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
        from grader.edits import Edit
        from grader.known_bugs import KNOWN_BUGS, Combination, Lookalikes, run_module_call
        from grader.relations import Variant

        key = digest(self._chapter.id, function, args, kwargs, recipe)
        if key in self._recording.lookalikes:
            return
        try:  # the right answer, to leave out the bugs that give it
            right = (run_module_call(self._reference, function, recipe, _cloned(args), _cloned(kwargs))
                     if recipe is not None else
                     getattr(self._reference, function)(*_cloned(args), **_cloned(kwargs)))
        except Exception:
            right = _NOTHING
        entries: list[tuple[list[int | list[int]], object, object]] = []
        catalog = KNOWN_BUGS[self._chapter.id]
        lookalikes = Lookalikes(self._chapter, function, args, kwargs, module=recipe)
        for bug, output in lookalikes.outputs_by_bug():
            if right is not _NOTHING and equal(output, right):
                continue
            if isinstance(bug, (Variant, Edit)):  # not the catalog's: its hint goes with it
                index = {"relation": bug.name, "hint": str(bug.hint)}
            elif isinstance(bug, Combination):
                index = [catalog.index(part) for part in bug.parts]
            else:
                index = catalog.index(bug)
            # Bugs with equal outputs share one entry, at the first one's
            # place: the first bug whose output an answer matches is the
            # same either way, so the hint is too. Only outputs of one
            # outline (``_outline``) can be equal: hundreds of edits
            # (``grader.edits``) are not each compared with every other.
            outline = _outline(output)
            same = next((entry for entry in entries if entry[3] == outline and equal(entry[2], output)), None)
            if same is not None:
                same[0].append(index)
            else:
                entries.append(([index], compacted(output), output, outline))
        self._recording.lookalikes[key] = [[indices, plain(compact)] for indices, compact, _, _ in entries]
        if right is not _NOTHING:  # every edit ran: what they raised is ``Replayer.raising``'s too
            self._recording.raised[key] = [[str(edit.hint), text] for edit, text in lookalikes.edits_raised]


_NOTHING = object()


def _outline(value: object) -> object:
    """What ``recorded_values.equal`` values share: kinds, shapes, dtypes and,
    of a tensor, its sum (NaN read as 0): cheap to compare, and equal for
    equal values."""
    if isinstance(value, (tuple, list)):
        return type(value).__name__, tuple(_outline(item) for item in value)
    if isinstance(value, torch.Tensor):
        total = value.detach().nan_to_num(0.0).sum().item() if value.is_floating_point() and value.numel() \
            else None
        return "tensor", tuple(value.shape), str(value.dtype), total
    if isinstance(value, np.ndarray):
        return "array", value.shape, str(value.dtype)
    return type(value).__name__


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

    def __reduce__(self):
        # Sent to a pool's process as its folder; what it reads there comes
        # from the process's copy of _read, forked after this one read it.
        return Replayer, (self.folder,)

    def recording(self, chapter: Chapter) -> Recording:
        if chapter.id not in self._recordings:
            path = self.folder / f"{chapter.id}.rec"
            self._recordings[chapter.id] = _read(path, path.stat().st_mtime_ns) if path.exists() else Recording()
        return self._recordings[chapter.id]

    def reference(self, chapter: Chapter, check: str, load=None):
        return ReplayReference(chapter, check, self.recording(chapter))

    def bugs(self, chapter: Chapter, check: str, load=None, seen=()):
        return ReplayBugs(chapter, self.recording(chapter), seen)

    def raising(self, chapter: Chapter, call: Raised, seen=()) -> list[tuple[str, str]]:
        """As ``Live.raising``, from the recording of the reference's grade
        (``Recorder.submitted``); none for a call it did not make (its
        inputs came from the student's own answers)."""
        from grader.relations import EDIT, RelationHint, edits_to_try

        recorded = self.recording(chapter).raised.get(
            digest(chapter.id, call.function, call.args, call.kwargs, call.module))
        if not recorded:
            return []
        wanted = edits_to_try(seen)
        return [(RelationHint(hint, EDIT), text) for hint, text in recorded if wanted(hint)]

    def oracle(self, chapter: Chapter, name: str, args: tuple, kwargs: dict):
        """An oracle's recorded answer."""
        node = self.recording(chapter).answers.get(digest(chapter.id, ORACLE + name, args, kwargs, None))
        if node is None:
            raise NotRecorded(f"a check asked the oracle {name} for a call that mha-course release "
                              "did not record")
        return value_of(node)

    def seed(self, seed: int | None) -> int:
        """The seed a grade uses: one that was recorded."""
        if seed is None:
            return secrets.choice(self.seeds)
        if seed not in self.seeds:
            raise ValueError(f"--seed {seed} was not recorded in this edition of the course; "
                             f"use one of {', '.join(map(str, self.seeds))}, or no --seed")
        return seed


@functools.lru_cache(maxsize=None)
def _read(path: Path, modified: int) -> Recording:
    """A recording file, read and decompressed once a process (a pool of
    verify's known bugs asks for it once a bug): each Replayer holds the
    same one. ``modified`` (the file's mtime) keys a file written again."""
    return Recording.load(path)


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
        return value_of(node)


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
        return self._outputs()

    def part(self, index: int, answer: object = None):
        """As ``Lookalikes.part``."""
        from grader.known_bugs import explaining_the_rest

        return lambda: explaining_the_rest(self._outputs(), index, answer)

    def _outputs(self) -> Iterator[tuple[str, object]]:
        from grader.chapters import KnownBug
        from grader.known_bugs import KNOWN_BUGS, Combination, seen_first
        from grader.relations import EDIT, RelationHint, Variant, edits_to_try

        catalog = KNOWN_BUGS.get(self._chapter.id, ())

        def bug_of(index: int | list[int] | dict):
            if isinstance(index, dict):
                return Variant(RelationHint(index["hint"], index["relation"]), (), {})
            return Combination(tuple(catalog[i] for i in index)) if isinstance(index, list) else catalog[index]

        # One (bug, output) pair per bug, in the recorded order, then, as
        # Lookalikes orders them, the single bugs before the combinations
        # and in each the bugs seen earlier in the run first; then the
        # relations' variants.
        pairs = [(bug_of(index), node) for indices, node in self._recording.lookalikes.get(self._key, ())
                 for index in indices]
        singles = [pair for pair in pairs if isinstance(pair[0], KnownBug)]
        together = [pair for pair in pairs if isinstance(pair[0], Combination)]
        changed = [pair for pair in pairs if isinstance(pair[0], Variant) and pair[0].name != EDIT]
        for bug, node in seen_first(singles, lambda pair: pair[0].hint, self._seen) + \
                seen_first(together, lambda pair: pair[0].hint, self._seen) + changed:
            yield bug.hint, value_of(node)
        # Last the edits of the reference, those that can still be named (``relations.Seen``),
        # counted as tried once reached, as ``Lookalikes`` counts them.
        wanted = edits_to_try(self._seen)
        for bug, node in pairs:
            if isinstance(bug, Variant) and bug.name == EDIT and wanted(bug.hint):
                yield bug.hint, value_of(node)


def live_raising(chapter: Chapter, call: Raised, seen=()) -> list[tuple[str, str]]:
    """``Live.raising``: the edits run here, on the call's inputs."""
    from grader.known_bugs import Lookalikes

    lookalikes = Lookalikes(chapter, call.function, call.args, call.kwargs, module=call.module, seen=seen)
    return [(edit.hint, text) for edit, text in lookalikes.raised_by_edits()]


# -- oracles ----------------------------------------------------------------------------

# An oracle's calls are keyed apart from the reference's functions of the same name.
ORACLE = "oracle:"


def live_oracle(chapter: Chapter, name: str) -> Callable:
    """The function ``name`` of ``grader/chapters/chNN/oracles.py`` (instructor's tree only)."""
    import importlib

    return getattr(importlib.import_module(f"{chapter.package}.oracles"), name)


# -- the mode ---------------------------------------------------------------------------


Mode = Live | Recorder | Replayer


def tree_mode() -> Mode:
    """The mode this tree grades in when the caller names none: replayed
    in a student edition, live in the instructor's tree."""
    return Replayer() if is_student_edition() else Live()
