"""Mistakes that no known bug catalogues, each with the hint it should get.

The known-bug catalog (``grader/chapters/chNN/bugs.py``) names the mistakes
it holds. Any other mistake is named, when it can be, by a relation between
the wrong answer and the expected one (``grader.relations``): "your weights
sum to 1 over the queries, not the keys". This corpus measures that: each
chapter's file, ``chNN.py``, holds ``MISTAKES``, one-line edits of the
reference solution written as students write them (at least five an
exercise), none the same mistake as a catalogued bug, each with the
relation whose hint it should get, or None where no relation says what is
wrong. ``bench/hints.py`` grades them all and prints the share of caught
mistakes that get their hint and the number that get a wrong one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

MIN_MISTAKES = 5  # an exercise's, at least


@dataclass(frozen=True)
class Mistake:
    """Replace ``old`` (once in the function or class ``exercise`` of the
    reference solution) by ``new``, as ``KnownBug`` does.

    ``relation``: the name of the relation (``grader.relations``) whose hint
    the wrong answer should get, a tuple of names where each is right, or
    None where none of them explains the answer. ``why``: the mistake in a
    few words.
    """

    exercise: str
    name: str
    old: str
    new: str
    relation: str | tuple[str, ...] | None
    why: str = ""

    @property
    def relations(self) -> tuple[str, ...]:
        """The right relations' names (none where no relation explains it)."""
        if self.relation is None:
            return ()
        return (self.relation,) if isinstance(self.relation, str) else tuple(self.relation)


def of_chapter(chapter_id: str) -> tuple[Mistake, ...]:
    """The chapter's ``MISTAKES`` (``chNN.py`` beside this file); none where it has no file."""
    name = f"{__name__}.{chapter_id}"
    try:
        return importlib.import_module(name).MISTAKES
    except ModuleNotFoundError as error:
        if error.name != name:
            raise
        return ()
