"""Each chapter's grading, one package a chapter: ``grader/chapters/chNN/``.

A chapter's package holds all that grades it besides its reference
solution: its hidden checks (``test_chNN_slug.py``, a pytest file), its
known bugs (``bugs.py``) and its independent oracles (``oracles.py``), as
``chapters/NN_slug/`` holds all that teaches it. ``grader/README.md`` has the
recipe for a new one.

A chapter's ``bugs.py`` defines ``BUGS``, a tuple of ``KnownBug``: realistic
wrong implementations written as one-line edits of the reference solution,
with the hint a student reads when their answer matches one. The machinery
that applies them lives in ``grader.known_bugs``, whose ``KNOWN_BUGS`` is
the catalog of them all.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from grader.catalog import CHAPTERS


@dataclass(frozen=True)
class KnownBug:
    """Replace ``old`` by ``new`` inside the function (or class) ``exercise``.

    A bug that makes the code raise rather than return a wrong value (``view``
    on a transposed tensor, ``-1e9`` in float16) sets ``error``: a regular
    expression matched against the exception's message, which then gets
    ``hint``.
    """

    exercise: str
    name: str
    hint: str
    old: str
    new: str
    error: str = ""


def read_known_bugs() -> dict[str, tuple[KnownBug, ...]]:
    """``{chapter id: its bugs}``, from each ``grader/chapters/chNN/bugs.py``
    (``BUGS``); read through ``grader.known_bugs.KNOWN_BUGS``."""
    found = {}
    for chapter in CHAPTERS:
        name = f"{chapter.package}.bugs"
        try:
            found[chapter.id] = importlib.import_module(name).BUGS
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
            found[chapter.id] = ()
    return found
