"""Which file of a chapter is graded: one rule for ``grade``, ``batch`` and Gradescope.

A chapter may have two files, ``chNN_topic.py`` and ``chNN_topic.ipynb``,
and only one holds the work: a student who writes in the notebook keeps the
untouched ``.py``, and Jupyter's autosave makes an untouched notebook the
newer file; one who copies the stub to ``alice_ch01.py`` keeps the untouched
``chNN_topic.py`` too. So the file with the fewest exercises left to write
(``raise NotImplementedError``) wins, then one named like the exercise, then
the one saved last; the report says which was graded and why.

A folder (``grade --dir``, a student's folder in ``batch``, Gradescope's
``submission/``) may nest its files in folders and name them its own way
(``alice_ch01.ipynb``, ``ch1_attention.py``): ``find_chapters`` walks it,
with one depth limit and one naming rule, and picks each chapter's file with
``best_file``; ``chapter_choice`` is the same rule for one chapter, as
``grade`` asks it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grader.catalog import CHAPTERS, SUBMISSION_SUFFIXES, Chapter, UnknownChapter, chapter_in_name

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


def best_file(paths: list[Path], named: Sequence[Path] = ()) -> tuple[Path, str]:
    """The file to grade of ``paths`` (at least one), and why, in a few words
    for the report (empty when there was no choice): the most written, then
    one of ``named`` (those named like the exercise), then the one saved last."""
    if len(paths) == 1:
        return paths[0], ""
    left = {path: unfinished(path) for path in paths}
    ranked = sorted(paths, key=lambda path: (left[path], path not in named, -path.stat().st_mtime, str(path)))
    best, runner_up = ranked[0], ranked[1]
    if left[best] < left[runner_up]:
        return best, f"it has more written than {runner_up.name}"
    if best in named and runner_up not in named:
        return best, f"named like the exercise, unlike {runner_up.name}"
    return best, f"saved after {runner_up.name}"


def chapter_choice(chapter: Chapter, directory: Path) -> tuple[Path, str] | None:
    """The chapter's file in ``directory`` and why it was chosen, by the rule
    ``batch`` and Gradescope follow (``find_chapters``); None if there is none.

    ``grade --dir`` asks this for each chapter: a folder holding
    ``alice_ch01.py`` is graded by ``grade`` as by ``batch``."""
    found = find_chapters(directory, [chapter])
    if chapter.id not in found.chosen:
        return None
    return found.chosen[chapter.id], found.why[chapter.id]


def chapter_file(chapter: Chapter, directory: Path) -> Path | None:
    """The chapter's file in ``directory``, as ``chapter_choice`` picks it."""
    choice = chapter_choice(chapter, directory)
    return choice[0] if choice else None


# -- a submission folder: which file is each chapter's -----------------------------

MAX_FOLDER_DEPTH = 3  # folders inside folders looked through: ``alice/hw1/exercises/``
# Names that hold no work besides hidden ones: what zip tools, file managers
# and Python add beside a student's files.
NOT_WORK = {"__MACOSX", "__pycache__", "Thumbs.db", "desktop.ini"}


def holds_no_work(name: str) -> bool:
    """A file's or folder's name that is never a student's work, wherever
    it is (a class folder, a student's folder, a zip): hidden (``.git``,
    ``.DS_Store``, ``.ipynb_checkpoints``, whose ``-checkpoint`` copies would
    otherwise count as chapter files, macOS's ``._name`` companions) or
    ``NOT_WORK``. ``..`` is no name of a file: a path that climbs out is
    refused where it is read, not skipped."""
    return name in NOT_WORK or name.startswith(".") and name not in (".", "..")


def submission_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """The files of ``folder`` that could be graded (``.py``, ``.ipynb``), in
    it or in its folders down to ``MAX_FOLDER_DEPTH``, sorted; and, apart,
    the links and special files found with those names.

    What ``holds_no_work`` is skipped. Links are never
    followed nor graded: a link to the reference solution is not the
    student's work, and a FIFO would hang the read.
    """
    files, refused = [], []
    for directory, folders, names in os.walk(folder):  # os.walk does not enter linked folders
        depth = len(Path(directory).relative_to(folder).parts)
        folders[:] = [name for name in folders if depth < MAX_FOLDER_DEPTH and not holds_no_work(name)]
        for name in names:
            path = Path(directory) / name
            if holds_no_work(name) or path.suffix not in SUBMISSION_SUFFIXES:
                continue
            if path.is_symlink() or not path.is_file():
                refused.append(path)
            else:
                files.append(path)
    return sorted(files), sorted(refused)


@dataclass
class Found:
    """What a submission folder holds for grading.

    Attributes:
        folder: the submission folder; files are shown relative to it.
        chosen: by chapter id, the file to grade.
        why: by chapter id, why that file of several ("" when it was the only one).
        unnamed: files (shown) whose name gives no chapter of the course.
        others: files (shown) of chapters not asked for.
        ignored: one line per file left out: the file, then why.
    """

    folder: Path = Path(".")
    chosen: dict[str, Path] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    unnamed: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def shown(self, path: Path) -> str:
        """A file as the student knows it: its path inside the submission."""
        return path.relative_to(self.folder).as_posix()

    def sources(self) -> dict[str, str]:
        """``GradeReport.sources``: by chapter id, the file graded and why."""
        sources = {}
        for chapter_id, path in self.chosen.items():
            why = self.why.get(chapter_id, "")
            sources[chapter_id] = self.shown(path) + (f" ({why})" if why else "")
        return sources


def find_chapters(folder: Path, chapters: Sequence[Chapter] = CHAPTERS) -> Found:
    """The file to grade for each of ``chapters`` in a submission folder:
    the rule of ``mha-course batch`` and of the Gradescope autograder.

    A file is a chapter's when its name holds ``chNN`` as a word
    (``ch01_self_attention.py``, ``alice_ch01.ipynb``, any case), at the top
    or in a folder below. Of several, ``best_file`` picks (the most
    written, then one named like the exercise, then the one saved last);
    the others are listed as ignored, and ``why`` says what decided.
    """
    found = Found(folder)
    files, refused = submission_files(folder)
    found.ignored += [f"{found.shown(path)}: {'a link' if path.is_symlink() else 'not a regular file'}, "
                      "not a file to grade" for path in refused]
    by_chapter: dict[str, list[Path]] = {}
    for path in files:
        try:
            chapter = chapter_in_name(path.name)
        except UnknownChapter:  # ch09 in an eight-chapter course: named, but for nothing
            chapter = None
        if chapter is None:
            found.unnamed.append(found.shown(path))
            found.ignored.append(f"{found.shown(path)}: its name names no chapter "
                                 f"(expected names like {CHAPTERS[0].module}{path.suffix})")
        elif chapter not in chapters:
            found.others.append(found.shown(path))
            found.ignored.append(f"{found.shown(path)}: {chapter.id} is not graded in this assignment")
        else:
            by_chapter.setdefault(chapter.id, []).append(path)
    for chapter in chapters:
        pool = by_chapter.get(chapter.id, [])
        if not pool:
            continue
        named = [path for path in pool if path.stem.lower() == chapter.module]
        found.chosen[chapter.id], found.why[chapter.id] = best_file(pool, named)
        found.ignored += [f"{found.shown(path)}: {chapter.id} was graded from "
                          f"{found.shown(found.chosen[chapter.id])}"
                          for path in pool if path != found.chosen[chapter.id]]
    return found
