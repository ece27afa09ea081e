"""The student edition grades every known bug as the instructor's tree does.

Apart from tests/test_release.py so that its one long test (a second verify
run, in the edition's replay mode) runs beside that file's: it reads the
suite's student edition (conftest's ``edition``) and the suite's verify run
in this tree (conftest's ``verification``), each computed once per suite.
Using both, it may take conftest's SHARED_TIMEOUT, as it may compute them.
"""

from __future__ import annotations

from conftest import ADDED_BUGS, VERIFY_SEED
from grader import recorded


def test_the_edition_catches_every_known_bug_as_the_tree_does(edition, verification, monkeypatch):
    """verify in the edition's mode (answers of the reference and the oracles
    replayed, never computed) fails the same checks for every known bug as
    verify in this tree: no check depends on an answer that was not recorded."""
    from grader.verify import verify

    monkeypatch.setattr(recorded, "live_oracle", None)  # replay must never compute
    replayed = verify(seed=VERIFY_SEED, jobs=2, mode=recorded.Replayer(edition / "grader" / "recorded"))
    added = {bug.name for bug in ADDED_BUGS}  # the suite's verify run has them, the edition's catalog not
    for mine, theirs in zip(verification.exercises, replayed.exercises, strict=True):
        assert (mine.checks, mine.reference_failures, mine.stub_passes) == (
            theirs.checks, theirs.reference_failures, theirs.stub_passes), mine.exercise.name
        for found, found_in_edition in ((mine.catches, theirs.catches), (mine.hints, theirs.hints)):
            assert {bug: value for bug, value in found.items() if bug not in added} == found_in_edition, \
                mine.exercise.name
        assert [bug for bug in mine.unnamed if bug not in added] == theirs.unnamed == [], mine.exercise.name
