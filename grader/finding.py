"""Which file of a chapter is graded: one rule for ``grade``, ``batch`` and Gradescope.

A chapter may have two files, ``chNN_topic.py`` and ``chNN_topic.ipynb``,
and only one holds the work: a student who writes in the notebook keeps the
untouched ``.py``, and Jupyter's autosave makes an untouched notebook the
newer file. So the file with the fewest exercises left to write (``raise
NotImplementedError``) wins, then the one saved last; the report says which
was graded and why.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from grader.catalog import SUBMISSION_SUFFIXES, Chapter

# A statement, at the start of its line: a docstring that says "the lines
# that raise NotImplementedError" is no exercise left to write.
UNFINISHED = re.compile(r"^\s*raise\s+NotImplementedError\b", re.MULTILINE)


def unfinished(path: Path) -> int:
    """How many ``raise NotImplementedError`` statements a file's code still
    holds (of a notebook, its graded code cells: the lesson's text mentions
    it too); an unreadable file counts as the least finished."""
    if path.suffix == ".ipynb":
        from grader.notebooks import NotebookError, read_notebook

        try:
            text = read_notebook(path).source
        except NotebookError:
            return sys.maxsize
    else:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return sys.maxsize
    return len(UNFINISHED.findall(text))


def best_file(paths: list[Path]) -> tuple[Path, str]:
    """The file to grade of ``paths`` (at least one), and why, in a few words
    for the report (empty when there was no choice)."""
    if len(paths) == 1:
        return paths[0], ""
    left = {path: unfinished(path) for path in paths}
    ranked = sorted(paths, key=lambda path: (left[path], -path.stat().st_mtime, str(path)))
    best, runner_up = ranked[0], ranked[1]
    if left[best] < left[runner_up]:
        return best, f"it has more written than {runner_up.name}"
    return best, f"saved after {runner_up.name}"


def chapter_choice(chapter: Chapter, directory: Path) -> tuple[Path, str] | None:
    """The chapter's file in ``directory`` (``chNN_topic.py`` or ``.ipynb``)
    and why it was chosen; None if there is neither."""
    found = [directory / f"{chapter.module}{suffix}" for suffix in SUBMISSION_SUFFIXES]
    found = [path for path in found if path.is_file()]
    return best_file(found) if found else None


def chapter_file(chapter: Chapter, directory: Path) -> Path | None:
    """The chapter's file in ``directory``, as ``chapter_choice`` picks it."""
    choice = chapter_choice(chapter, directory)
    return choice[0] if choice else None
