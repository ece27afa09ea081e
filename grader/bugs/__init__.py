"""The catalog of known bugs: one module a chapter, ``grader/bugs/chNN.py``.

Each module defines ``BUGS``, a tuple of ``KnownBug``: realistic wrong
implementations written as one-line edits of the reference solution, with
the hint a student reads when their answer matches one. The machinery that
applies them lives in ``grader.known_bugs``.
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


def known_bugs_catalog() -> dict[str, tuple[KnownBug, ...]]:
    """``{chapter id: its bugs}``, from ``grader/bugs/chNN.py`` (``BUGS``)."""
    found = {}
    for chapter in CHAPTERS:
        name = f"grader.bugs.{chapter.id}"
        try:
            found[chapter.id] = importlib.import_module(name).BUGS
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
            found[chapter.id] = ()
    return found
