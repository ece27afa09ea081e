"""A class's folder of submissions (``mha-course batch SUBMISSIONS``): its
entries, one a student, with the content hash that tells a changed one; and
each entry's chapter files, a zip unpacked within bounds first.

An entry is a student's folder, a single ``.py`` file or ``.ipynb`` notebook
whose chapter is the ``chNN`` in its name, or a ``.zip`` of either.
``submission_targets`` says which file of each chapter is graded, by the
rule the Gradescope autograder follows (``finding.find_chapters``), or
raises ``Unusable`` with the reason a row of the class shows.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import time
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from grader.catalog import (
    CHAPTERS,
    SUBMISSION_SUFFIXES,
    Chapter,
    UnknownChapter,
    chapter_in_name,
)
from grader.finding import Found, find_chapters, submission_files

# A zip is unpacked only within these bounds: a class's exercises are a few
# hundred kilobytes, so anything far larger is a mistake or a zip bomb.
MAX_UNPACKED_BYTES = 50 * 2**20
MAX_ZIP_MEMBERS = 2000
# Left out of the listing of SUBMISSIONS: what zip tools and file managers add.
IGNORED_NAMES = {"__MACOSX", "Thumbs.db", "desktop.ini"}


class Unusable(Exception):
    """The submission (or one of its files) cannot be graded; the message is
    the reason that the CSV's ``note`` column shows."""


@dataclass(frozen=True)
class Entry:
    """One student's entry in SUBMISSIONS.

    Attributes:
        student: the student's id (the entry's name, less its suffix).
        path: the folder, file or zip.
        digest: sha256 (hex) of what the entry submits, to skip it on a re-run.
        size: bytes hashed; the largest entries are graded first.
    """

    student: str
    path: Path
    digest: str
    size: int


def list_entries(submissions: Path, leave_out: Path | None = None) -> list[Entry]:
    """One ``Entry`` per student, sorted by id.

    Hidden names (``.DS_Store``) and what zip tools add (``__MACOSX``) are
    left out, and so is ``leave_out`` (the out folder, when it sits inside
    SUBMISSIONS). Two entries with the same id (``alice/`` and ``alice.zip``)
    each keep their whole name as id, so neither overwrites the other.
    """
    paths = entry_paths(submissions, leave_out)
    stems = Counter(_student_id(path) for path in paths)
    entries = []
    for path in paths:
        student = _student_id(path) if stems[_student_id(path)] == 1 else path.name
        digest, size = entry_digest(path)
        entries.append(Entry(student, path, digest, size))
    return sorted(entries, key=lambda entry: (entry.student.casefold(), entry.student))


def entry_paths(submissions: Path, leave_out: Path | None = None) -> list[Path]:
    """The students' entries in ``submissions``: every name but hidden ones,
    what zip tools add, and ``leave_out``."""
    return [path for path in submissions.iterdir()
            if not path.name.startswith(".") and path.name not in IGNORED_NAMES
            and (leave_out is None or path.resolve() != leave_out.resolve())]


def _student_id(path: Path) -> str:
    if path.suffix.lower() in (".zip", *SUBMISSION_SUFFIXES) and not path.is_dir() and path.stem:
        return path.stem
    return path.name


def entry_digest(path: Path) -> tuple[str, int]:
    """sha256 (hex) and size in bytes of what an entry submits.

    A file or zip: its bytes. A folder: the path and bytes of each file that
    could be graded (``finding.submission_files``), so a folder's other
    contents (data, checkpoints) neither count nor get read. A file that
    cannot be read is hashed as such: grading will say why.
    """
    digest = hashlib.sha256()
    size = 0
    if path.is_dir():
        files, _ = submission_files(path)
        names = [file.relative_to(path).as_posix() for file in files]
    else:
        files = [path] if path.is_file() else []  # a pipe or a dangling link: never opened
        names = [path.name]
        digest.update(f"{path.name}\n".encode())
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


def chapters_of(folder: Path) -> Found:
    """The file to grade for each chapter of a student's folder, and why, as
    ``finding.find_chapters`` picks them (the Gradescope autograder's rule).

    Raises:
        Unusable: no file names a chapter (the reason lists what is there).
    """
    found = find_chapters(folder)
    if not found.chosen:
        raise Unusable(_nothing_to_grade(folder, found.unnamed))
    return found


def _nothing_to_grade(folder: Path, unnamed: list[str]) -> str:
    expected = f"expected names like {CHAPTERS[0].module}.py or .ipynb"
    if unnamed:
        return f"no file names its chapter ({expected}); found {', '.join(sorted(unnamed)[:4])}"
    try:
        present = sorted(path.name for path in folder.iterdir() if not path.name.startswith("."))
    except OSError as error:
        return f"cannot list the folder: {error.strerror}"
    if not present:
        return f"the submission is empty ({expected})"
    return f"no exercise file ({expected}); found {', '.join(present[:4])}"


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
    """Hidden files and folders (``.git/``, ``.ipynb_checkpoints/``) and what
    macOS's zips add (``__MACOSX/``): never graded, so never unpacked.
    ``..`` is no hidden name: a path that climbs out is refused, not skipped."""
    parts = PurePosixPath(info.filename.replace("\\", "/")).parts
    return any(part in IGNORED_NAMES or part.startswith(".") and part not in (".", "..") for part in parts)


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


def submission_targets(entry: Path, scratch: Path) -> tuple[list[tuple[Chapter, Path]], Found]:
    """``(chapter, file)`` pairs to grade for one entry, in chapter order, and
    what was found, as the student named it (``Found.sources``: each file
    graded and why that one); a zip is unpacked into ``scratch`` (an empty
    folder) first.

    Raises:
        Unusable: nothing in the entry can be graded; the message says why.
    """
    suffix = entry.suffix.lower()
    if entry.is_dir():
        found = chapters_of(entry)
        files = found.chosen
    elif suffix == ".zip":
        extract_zip(entry, scratch)
        found = chapters_of(scratch)
        files = found.chosen
    elif suffix in SUBMISSION_SUFFIXES:
        try:
            chapter = chapter_in_name(entry.name)
        except UnknownChapter as error:
            raise Unusable(str(error)) from None
        if chapter is None:
            raise Unusable(f"cannot tell which chapter {entry.name} is for: put chNN in its name "
                           f"(like {entry.stem}_ch01{suffix})")
        # Graded from a copy in a folder of its own: the file's folder is the
        # class's. (And ALICE_CH01.PY: the loader tells notebooks by ".ipynb".)
        copy = scratch / f"{entry.stem}{suffix}"
        shutil.copy2(entry, copy)
        found = Found(entry.parent, chosen={chapter.id: entry}, why={chapter.id: ""})
        files = {chapter.id: copy}
    else:
        raise Unusable(f"{entry.name} is not a folder, a .py file, an .ipynb notebook or a .zip")
    return [(chapter, files[chapter.id]) for chapter in CHAPTERS if chapter.id in files], found
