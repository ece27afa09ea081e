"""A class's folder of submissions (``mha-course batch SUBMISSIONS``): its
entries, one a student, with the content hash that tells a changed one; and
each entry's chapter files, a zip unpacked within bounds first.

An entry is a student's folder, a ``.zip`` of one, or the student's loose
``.py`` files and ``.ipynb`` notebooks, each one's chapter the ``chNN`` in
its name: ``bob_ch01.py`` and ``bob_ch04.py`` are one student, ``bob``.
``submission_targets`` says which file of each chapter is graded, by the
rule the Gradescope autograder follows (``finding.find_chapters``), or
raises ``Unusable`` with the reason a row of the class shows.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import time
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from grader.catalog import (
    CHAPTER_IN_NAME,
    CHAPTERS,
    SUBMISSION_SUFFIXES,
    Chapter,
    UnknownChapter,
    chapter_in_name,
)
from grader.finding import Found, find_chapters, holds_no_work, submission_files

# A zip is unpacked only within these bounds: a class's exercises are a few
# hundred kilobytes, so anything far larger is a mistake or a zip bomb.
MAX_UNPACKED_BYTES = 50 * 2**20
MAX_ZIP_MEMBERS = 2000


class Unusable(Exception):
    """The submission (or one of its files) cannot be graded; the message is
    the reason that the CSV's ``note`` column shows."""


@dataclass(frozen=True)
class Entry:
    """One student's entry in SUBMISSIONS.

    Attributes:
        student: the student's id (the entry's name, less its suffix, and a
            loose file's less its chapter).
        paths: the folder or the zip, or the student's loose files, sorted.
        digest: sha256 (hex) of what the entry submits, to skip it on a re-run.
        size: bytes hashed; the largest entries are graded first.
    """

    student: str
    paths: tuple[Path, ...]
    digest: str
    size: int


def list_entries(submissions: Path, leave_out: Path | None = None) -> list[Entry]:
    """One ``Entry`` per student, sorted by id.

    What ``finding.holds_no_work`` (``.DS_Store``, ``__MACOSX``) is left
    out, and so is ``leave_out`` (the out folder, when it sits inside
    SUBMISSIONS). A student's loose files are one entry. Where a folder or a
    zip has the id of another entry (``alice/`` and ``alice.zip``, or
    ``alice_ch01.py``), each path keeps its whole name as id, so none
    overwrites another.
    """
    by_student: dict[str, list[Path]] = {}
    for path in entry_paths(submissions, leave_out):
        by_student.setdefault(student_id(path), []).append(path)
    entries = []
    for student, paths in by_student.items():
        if len(paths) > 1 and not all(map(is_loose, paths)):
            groups = [(path.name, (path,)) for path in paths]
        else:
            groups = [(student, tuple(sorted(paths)))]
        for name, group in groups:
            digest, size = entry_digest(group)
            entries.append(Entry(name, group, digest, size))
    return sorted(entries, key=lambda entry: (entry.student.casefold(), entry.student))


def entry_paths(submissions: Path, leave_out: Path | None = None) -> list[Path]:
    """The students' entries in ``submissions``: every name but hidden ones,
    what zip tools add, and ``leave_out``."""
    return [path for path in submissions.iterdir()
            if not holds_no_work(path.name) and (leave_out is None or path.resolve() != leave_out.resolve())]


# ``chNN`` as a word, in the name as it is written: what comes before it is the student.
CHAPTER_PART = re.compile(CHAPTER_IN_NAME.pattern, re.IGNORECASE)


def is_loose(path: Path) -> bool:
    """A single ``.py`` or ``.ipynb`` in SUBMISSIONS, not in a student's folder."""
    return path.suffix.lower() in SUBMISSION_SUFFIXES and not path.is_dir() and bool(path.stem)


def student_id(path: Path) -> str:
    """The student an entry's path is for: a folder's name, a zip's less
    ``.zip``, a loose file's less its suffix and its chapter (``bob_ch01.py``
    and ``Bob-CH4-rope.ipynb``: ``bob`` and ``Bob``). A loose file named for
    its chapter only (``ch01_self_attention.py``) keeps its whole stem."""
    if is_loose(path):
        match = CHAPTER_PART.search(path.stem)
        student = path.stem[:match.start()].rstrip("_-. ") if match else ""
        return student or path.stem
    if path.suffix.lower() == ".zip" and not path.is_dir() and path.stem:
        return path.stem
    return path.name


def entry_digest(paths: tuple[Path, ...]) -> tuple[str, int]:
    """sha256 (hex) and size in bytes of what an entry submits.

    Files or a zip: their names and bytes. A folder: the path and bytes of
    each file that could be graded (``finding.submission_files``), so a
    folder's other contents (data, checkpoints) neither count nor get read.
    A file that cannot be read is hashed as such: grading will say why.
    """
    digest = hashlib.sha256()
    size = 0
    if len(paths) == 1 and paths[0].is_dir():
        files, _ = submission_files(paths[0])
        names = [file.relative_to(paths[0]).as_posix() for file in files]
    else:
        files = [path for path in paths if path.is_file()]  # a pipe or a dangling link: never opened
        names = [path.name for path in files]
        digest.update("".join(f"{path.name}\n" for path in paths).encode())
    for file, name in zip(files, names):
        digest.update(f"{name}\n".encode())
        try:
            with open(file, "rb") as stream:
                for block in iter(lambda: stream.read(2**20), b""):
                    digest.update(block)
                    size += len(block)
        except OSError as error:
            digest.update(f"unreadable: {error.strerror}".encode())
    return digest.hexdigest(), size


def chapters_of(folder: Path, chapters: Sequence[Chapter] = CHAPTERS) -> Found:
    """The file to grade for each of ``chapters`` in a student's folder, and
    why, as ``finding.find_chapters`` picks them (the Gradescope autograder's
    rule).

    Raises:
        Unusable: no file is one of ``chapters``' (the reason lists what is there).
    """
    found = find_chapters(folder, chapters)
    if not found.chosen:
        raise Unusable(_nothing_to_grade(folder, found, chapters))
    return found


def _nothing_to_grade(folder: Path, found: Found, chapters: Sequence[Chapter]) -> str:
    expected = f"expected names like {chapters[0].module}.py or .ipynb"
    if found.others:
        return (f"no file for {_listed(chapters)}; found only other chapters' files: "
                f"{', '.join(sorted(found.others)[:4])}")
    if found.unnamed:
        return f"no file names its chapter ({expected}); found {', '.join(sorted(found.unnamed)[:4])}"
    try:
        present = sorted(path.name for path in folder.iterdir() if not holds_no_work(path.name))
    except OSError as error:
        return f"cannot list the folder: {error.strerror}"
    if not present:
        return f"the submission is empty ({expected})"
    return f"no exercise file ({expected}); found {', '.join(present[:4])}"


def _listed(chapters: Sequence[Chapter]) -> str:
    """``ch01``, ``ch01 or ch04``, ``ch01, ch02 or ch04``."""
    ids = [chapter.id for chapter in chapters]
    return ids[0] if len(ids) == 1 else f"{', '.join(ids[:-1])} or {ids[-1]}"


def extract_zip(archive: Path, into: Path) -> None:
    """Unpack ``archive`` into the folder ``into``, safely.

    Refused, before anything is written: a member whose path leaves ``into``
    (``../x``, ``/etc/x``, ``C:\\x``), a symbolic link, an encrypted member,
    more than ``MAX_ZIP_MEMBERS`` members or ``MAX_UNPACKED_BYTES`` in all
    (counted again while unpacking: a zip's stated sizes may lie). Files
    keep the zip's modification times, so "the one saved last" still holds.

    Raises:
        Unusable: the zip is corrupt or refused; the message says which.
    """
    name = archive.name
    try:
        with zipfile.ZipFile(archive) as bundle:
            members = [info for info in bundle.infolist() if not _ignored_member(info)]
            targets = [_member_target(name, info, into) for info in members]
            if len(members) > MAX_ZIP_MEMBERS:
                raise Unusable(f"{name} holds {len(members)} files, more than {MAX_ZIP_MEMBERS}")
            if sum(info.file_size for info in members) > MAX_UNPACKED_BYTES:
                raise Unusable(f"{name} unpacks to more than {MAX_UNPACKED_BYTES // 2**20} MB")
            written = 0
            for info, target in zip(members, targets):
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with bundle.open(info) as source, open(target, "wb") as sink:
                    for block in iter(lambda: source.read(2**20), b""):
                        written += len(block)
                        if written > MAX_UNPACKED_BYTES:
                            raise Unusable(f"{name} unpacks to more than {MAX_UNPACKED_BYTES // 2**20} MB")
                        sink.write(block)
                _keep_time(target, info)
    except Unusable:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error):
        raise Unusable(f"{name} is not a valid zip file (corrupt or cut short)") from None
    except NotImplementedError as error:  # a compression method zipfile lacks
        raise Unusable(f"{name} cannot be unpacked: {error}") from None
    except OSError as error:
        raise Unusable(f"cannot unpack {name}: {error.strerror or error}") from None


def _ignored_member(info: zipfile.ZipInfo) -> bool:
    """A member in what ``finding.holds_no_work`` (``.git/``, ``__MACOSX/``):
    never graded, so never unpacked. A path that climbs out (``..``) is
    refused, not skipped."""
    parts = PurePosixPath(info.filename.replace("\\", "/")).parts
    return any(holds_no_work(part) for part in parts)


def _member_target(archive: str, info: zipfile.ZipInfo, into: Path) -> Path:
    """Where a zip member goes inside ``into``; refuses links, encryption and
    any path that would leave ``into``."""
    name = info.filename.replace("\\", "/")  # zips made on Windows may use backslashes
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts or (parts and ":" in parts[0]):
        raise Unusable(f"{archive} holds a path outside its folder ({info.filename}): not unpacked")
    if stat.S_ISLNK(info.external_attr >> 16):  # Unix mode bits sit in the high half
        raise Unusable(f"{archive} holds a symbolic link ({info.filename}): not unpacked")
    if info.flag_bits & 0x1:
        raise Unusable(f"{archive} is encrypted ({info.filename}): submit it without a password")
    target = into.joinpath(*[part for part in parts if part not in ("", ".")])
    if not target.resolve().is_relative_to(into.resolve()):
        raise Unusable(f"{archive} holds a path outside its folder ({info.filename}): not unpacked")
    return target


def _keep_time(path: Path, info: zipfile.ZipInfo) -> None:
    try:
        stamp = time.mktime((*info.date_time, 0, 0, -1))
        os.utime(path, (stamp, stamp))
    except (OverflowError, ValueError, OSError):  # a zip with a nonsense date: keep now
        pass


def submission_targets(paths: tuple[Path, ...], scratch: Path,
                       chapters: Sequence[Chapter] = CHAPTERS) -> tuple[list[tuple[Chapter, Path]], Found]:
    """``(chapter, file)`` pairs to grade for one entry (``Entry.paths``), of
    ``chapters``, in chapter order, and what was found, as the student named
    it (``Found.sources``: each file graded and why that one); a zip is
    unpacked, loose files are copied, into ``scratch`` (an empty folder) first.

    Raises:
        Unusable: nothing in the entry can be graded; the message says why.
    """
    first = paths[0]
    if len(paths) == 1 and first.is_dir():
        found = chapters_of(first, chapters)
    elif len(paths) == 1 and first.suffix.lower() == ".zip":
        extract_zip(first, scratch)
        found = chapters_of(scratch, chapters)
    elif all(map(is_loose, paths)):
        found = _loose_chapters(paths, scratch, chapters)
    else:
        raise Unusable(f"{first.name} is not a folder, a .py file, an .ipynb notebook or a .zip")
    return [(chapter, found.chosen[chapter.id]) for chapter in chapters if chapter.id in found.chosen], found


def _loose_chapters(files: tuple[Path, ...], scratch: Path, chapters: Sequence[Chapter]) -> Found:
    """The chapter files of a student's loose files, copied into ``scratch``
    under their own names and found there by ``find_chapters``'s rule (of
    ``bob_ch01.py`` and ``bob_ch01.ipynb``, the one with more written).

    Graded from copies in a folder of their own: the files' folder is the
    class's. (And ALICE_CH01.PY is copied as ALICE_CH01.py: the loader tells
    notebooks by ".ipynb".) Links and special files are not copied: a link
    to the reference solution is not the student's work.
    """
    refused = []
    for file in files:
        copy = scratch / f"{file.stem}{file.suffix.lower()}"
        if file.is_symlink() or not file.is_file() or copy.exists():
            refused.append(file)
        else:
            shutil.copy2(file, copy)
    found = find_chapters(scratch, chapters)
    if not found.chosen and found.others:
        raise Unusable(_nothing_to_grade(scratch, found, chapters))
    if not found.chosen:
        raise Unusable("; ".join(_loose_reason(file) for file in files))
    found.ignored += [f"{file.name}: {_loose_reason(file)}" for file in refused]
    return found


def _loose_reason(file: Path) -> str:
    """Why a loose file is not graded."""
    if file.is_symlink() or not file.is_file():
        return f"{file.name} is {'a link' if file.is_symlink() else 'not a regular file'}, not a file to grade"
    try:
        chapter = chapter_in_name(file.name)
    except UnknownChapter as error:
        return str(error)
    if chapter is None:
        return (f"cannot tell which chapter {file.name} is for: put chNN in its name "
                f"(like {file.stem}_ch01{file.suffix.lower()})")
    return f"{file.name} has the name of another file of {chapter.id}"
