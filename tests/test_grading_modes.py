"""No module holds how a grade answers: the reference's mode (live,
recorded, replayed) and the workers' account are handed to each grade, so
two grades in one process, graded two ways, do not leak into each other
(issue 31: no module-level state that changes what a function returns)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from grader import recorded
from grader.catalog import find_chapter
from grader.grading import UnrecordedSeed, grade

CH01 = find_chapter("ch01")
SEED = 7
ONLY = {"softmax", "scaled_dot_product_attention"}  # ch01's checks of these ask the reference and the oracles
GRADER = Path(__file__).resolve().parent.parent / "grader"


def _passed(report) -> bool:
    return all(result.status.counts_as_passed for result in report.exercises)


def test_a_recording_a_live_grade_and_a_replay_in_one_process_keep_apart(tmp_path, monkeypatch):
    solution = CH01.solution()
    recorder = recorded.Recorder()
    assert _passed(grade([(CH01, solution)], seed=SEED, only=ONLY, mode=recorder))
    answers = recorder.recordings["ch01"].answers
    asked = len(answers)
    assert asked > 0, "the checks asked the reference nothing"

    # A grade that names no mode is live: it records nothing in the recorder before it.
    assert _passed(grade([(CH01, solution)], seed=SEED + 1, only=ONLY))
    assert len(recorder.recordings["ch01"].answers) == asked

    # The same recording replayed, in an edition's files: no oracle or reference is computed.
    recorder.recordings["ch01"].save(tmp_path / "ch01.rec")
    (tmp_path / recorded.INDEX).write_text(json.dumps({"format": recorded.FORMAT, "seeds": [SEED]}),
                                           encoding="utf-8")
    replayer = recorded.Replayer(tmp_path)

    def computed(*args, **kwargs):
        raise AssertionError("a replayed grade computed an oracle")

    monkeypatch.setattr(recorded, "live_oracle", computed)
    replayed = grade([(CH01, solution)], seed=SEED, only=ONLY, mode=replayer)
    assert _passed(replayed), [(r.exercise.name, r.reason) for r in replayed.exercises]
    with pytest.raises(UnrecordedSeed):
        grade([(CH01, solution)], seed=SEED + 1, only=ONLY, mode=replayer)
    monkeypatch.undo()

    # And live again, with a seed the replay refused: the replay did not stay behind.
    assert _passed(grade([(CH01, solution)], seed=SEED + 1, only=ONLY))


def test_no_grader_function_rebinds_a_module_name():
    """A ``global`` statement is how a function changes what the module's
    other functions read. Two are left, neither a setting: the clean
    parent's link (this process's connection to the process that forks its
    fork servers, for the block that started it) and whether this process
    has frozen its objects out of the garbage collector's reach, which it
    does once (``grading._freeze_what_lives_on``); no answer depends on either."""
    found = []
    for path in sorted(GRADER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Global):
                found += [f"{path.relative_to(GRADER)}: {name}" for name in node.names]
    assert sorted(set(found)) == ["forkserver.py: _LINK", "grading.py: _frozen"]
