"""Grade a whole class: ``mha-course batch SUBMISSIONS``.

SUBMISSIONS is a folder with one entry per student, and the student's id is
the entry's name (without ``.zip``, ``.py`` or ``.ipynb``):

* a folder holding the chapters' files (``ch01_self_attention.py`` and/or
  ``.ipynb``, or a name holding ``chNN`` as a word, ``alice_ch01.ipynb``), at
  its top or in folders below it: ``finding.find_chapters`` picks each
  chapter's file, by the rule the Gradescope autograder follows;
* a single ``.py`` file or ``.ipynb`` notebook, whose chapter is the ``chNN``
  in its name (``alice_ch01.py``);
* a ``.zip`` of either, unpacked safely into a temporary folder.

Each student is graded on their own (one ``grade()`` call), in processes
forked from this one, so torch is imported once for the whole class. Only the
chapters a student submitted are graded; the other chapters' exercises score
0. A submission that cannot be graded is a row with the reason, never the end
of the batch.

What a run writes into the out folder: ``grades.csv`` (a row per student),
``results/STUDENT.json`` (Gradescope's ``results.json`` schema; its output
names the file graded for each chapter and why that one) and
``batch-state.json`` (each student's content hash, row and seed, so that a
re-run grades only the submissions that changed, and says which seed the
rows it kept were graded with).
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import json
import os
import pickle
import secrets
import select
import shutil
import signal
import stat
import tempfile
import time
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from grader import isolation, reaping
from grader.catalog import (
    CHAPTERS,
    COURSE_ROOT,
    SUBMISSION_SUFFIXES,
    Chapter,
    UnknownChapter,
    chapter_in_name,
)
from grader.finding import Found, find_chapters, submission_files
from grader.gradescope import with_missing_chapters
from grader.isolation import Limits

# torch and the grading modules are imported inside the functions that grade,
# so that the command line's checks of its arguments answer before torch loads.

# A zip is unpacked only within these bounds: a class's exercises are a few
# hundred kilobytes, so anything far larger is a mistake or a zip bomb.
MAX_UNPACKED_BYTES = 50 * 2**20
MAX_ZIP_MEMBERS = 2000

STATE_FILE = "batch-state.json"
CSV_FILE = "grades.csv"
RESULTS_FOLDER = "results"
STATE_VERSION = 3  # 3: each row keeps the seed it was graded with
KEY_FILE = ".batch-key"  # the key of the state's MAC, readable by its owner only
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


@dataclass
class StudentGrade:
    """One row of the class: what a student scored and why.

    Attributes:
        student: the student's id.
        digest: the entry's content hash when it was graded.
        scores: ``{"ch01/softmax": points scored}`` for every exercise of the course.
        graded: ids of the chapters that were graded (submitted and readable).
        note: why (part of) the submission could not be graded; "" when all was.
        bugs: ``(chapter id, exercise, bug name)`` of each catalog bug the
            student's answers matched.
        seconds: wall time of the grading.
        seed: the seed of the random inputs it was graded with (None: not graded).
        results: the Gradescope ``results.json`` dict (not kept in the state file).
        results_digest: sha256 (hex) of the ``results/STUDENT.json`` written for
            it: a re-run keeps the row only while that file is unchanged.
    """

    student: str
    digest: str
    scores: dict[str, int]
    graded: list[str]
    note: str = ""
    bugs: list[tuple[str, str, str]] = field(default_factory=list)
    seconds: float = 0.0
    seed: int | None = None
    results: dict | None = None
    results_digest: str = ""

    @property
    def total(self) -> int:
        return sum(self.scores.values())

    def state(self) -> dict:
        """What the state file keeps: the row, without the (large) results."""
        kept = asdict(self)
        del kept["results"]
        return kept

    @classmethod
    def from_state(cls, kept: dict) -> StudentGrade:
        return cls(**{**kept, "bugs": [tuple(bug) for bug in kept.get("bugs", [])]})


@dataclass
class BatchResult:
    """What ``run_batch`` did: every student's row, sorted by id, and which
    were graded now (the others were unchanged and kept)."""

    grades: list[StudentGrade]
    graded_now: set[str]
    checks_changed: bool  # since the last run: every student was graded again
    out: Path
    seed: int
    unprotected: str = ""  # which of the sandbox's protections this machine lacks (isolation.missing)


def exercise_key(chapter: Chapter, exercise_name: str) -> str:
    """The CSV column of an exercise: ``ch01/softmax``."""
    return f"{chapter.id}/{exercise_name}"


EXERCISE_KEYS = [exercise_key(chapter, exercise.name) for chapter in CHAPTERS for exercise in chapter.exercises]
COURSE_POINTS = sum(chapter.points for chapter in CHAPTERS)


# -- the class: SUBMISSIONS and each entry's content hash ----------------------------


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


def grader_fingerprint(root: Path = COURSE_ROOT) -> str:
    """sha256 of what decides a verdict: the catalog, the checks, the known
    bugs and the reference solutions. When one changes (a new check, a fixed
    reference), earlier grades no longer hold and every student is graded
    again. The grader's machinery is left out: a change there that alters
    verdicts is rare, and ``--force`` is there for it."""
    digest = hashlib.sha256()
    files = sorted([root / "grader" / "catalog.py", *(root / "grader" / "checks").glob("*.py"),
                    *(root / "grader" / "bugs").glob("*.py"), *(root / "solutions").glob("*.py")])
    for file in files:
        digest.update(file.relative_to(root).as_posix().encode() + b"\n")
        digest.update(file.read_bytes())
    return digest.hexdigest()


# -- one student's files ---------------------------------------------------------------


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


# -- grading one student (in a pool worker) -----------------------------------------


@dataclass(frozen=True)
class GradingOptions:
    """What every student is graded with: the same seed (so the same inputs)
    and the same limits, as ``mha-course grade`` takes them."""

    seed: int
    check_seconds: float = 10.0


def grade_student(entry: Entry, options: GradingOptions) -> StudentGrade:
    """Grade one entry; never raises for anything the submission holds.

    Runs in a worker process of the batch's pool; the student's code runs in
    processes ``grade()`` forks from it, as for ``mha-course grade``.
    """
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="mha-batch-") as scratch:
            grade = _grade_entry(entry, Path(scratch), options)
    except Exception as error:  # a bug of the grader: one row says so, the batch goes on
        grade = _ungraded(entry, f"the grader failed on this submission ({type(error).__name__}: "
                                 f"{error}); please report it")
    grade.seconds = round(time.perf_counter() - started, 3)
    return grade


def _grade_entry(entry: Entry, scratch: Path, options: GradingOptions) -> StudentGrade:
    from grader.grading import GraderError, grade
    from grader.loading import SubmissionError, load_submission
    from grader.report import results_json
    from grader.sandbox import Limits

    try:
        targets, found = submission_targets(entry.path, scratch)
    except Unusable as error:
        return _ungraded(entry, str(error))
    # A file the loader cannot read (not UTF-8, a notebook that is not JSON)
    # is left out with its reason; the student's other chapters are graded.
    readable, problems = [], {}
    for chapter, path in targets:
        try:
            load_submission(path, chapter.module)
            readable.append((chapter, path))
        except SubmissionError as error:
            problems[chapter.id] = f"{chapter.id} not graded: {error}"
    note = "; ".join(problems.values())
    if not readable:
        return _ungraded(entry, note)
    limits = Limits.per_check(options.check_seconds)
    try:
        report = grade(readable, limits=limits, seed=options.seed)
    except GraderError as error:
        return _ungraded(entry, f"the checks could not run: {str(error).splitlines()[0]}")
    graded = [chapter.id for chapter, _ in readable]
    sources = found.sources()
    report.sources = {chapter_id: sources[chapter_id] for chapter_id in graded}  # as `grade` shows them
    if problems:
        report.notes["submission"] = list(problems.values())
    scores = dict.fromkeys(EXERCISE_KEYS, 0)  # a chapter not graded scores 0
    scores.update({exercise_key(result.chapter, result.exercise.name): result.score
                   for result in report.exercises})
    files = {chapter_id: found.shown(found.chosen[chapter_id]) for chapter_id in graded}
    return StudentGrade(entry.student, entry.digest, scores, graded, note, known_bugs_in(report),
                        seed=report.seed, results=_results(results_json(report), problems, report.seed, files))


def _results(graded: dict, reasons: dict[str, str], seed: int | None, files: dict[str, str]) -> dict:
    """A student's results JSON, as the Gradescope autograder writes one:
    ``graded`` (``report.results_json`` of the chapters graded, whose output
    names each file and why that one) with every other exercise of the
    course at 0 points, saying why (``reasons`` by chapter id, else that
    the chapter has no file), and ``extra_data``: the seed and, by chapter
    id, the file graded."""
    results = with_missing_chapters(graded, CHAPTERS, reasons)
    results["extra_data"] = {"seed": seed, "files": files}
    return results


def _ungraded(entry: Entry, reason: str) -> StudentGrade:
    """The row of a submission that could not be graded: 0 points, the reason."""
    graded = {"output": f"submission: {reason}", "execution_time": 0.0, "tests": []}
    reasons = {chapter.id: f"not graded: {reason}" for chapter in CHAPTERS}
    return StudentGrade(entry.student, entry.digest, dict.fromkeys(EXERCISE_KEYS, 0), [], reason,
                        results=_results(graded, reasons, None, {}))


def known_bugs_in(report) -> list[tuple[str, str, str]]:
    """``(chapter id, exercise, bug name)`` of each catalog bug a report's
    failed checks name by their hint, each once, in catalog order.

    A check's hint is the text of the known bug its value matched. Bugs may
    share a hint (one wording for the same slip in two functions), so the
    bug of the check's own exercise is preferred; a later exercise that
    calls a buggy earlier one (self-attention calling a scaled-dot-product
    without 1/sqrt(d)) names the earlier one's bug, counted once.
    """
    from grader.known_bugs import KNOWN_BUGS

    found: set[tuple[str, str, str]] = set()
    for result in report.exercises:
        for check in result.failed_checks:
            if not check.hint:
                continue
            matches = [bug for bug in KNOWN_BUGS.get(check.chapter, ()) if bug.hint == check.hint]
            if matches:
                bug = next((bug for bug in matches if bug.exercise == check.exercise), matches[0])
                found.add((check.chapter, bug.exercise, bug.name))
    order = {(chapter, bug.exercise, bug.name): index
             for chapter, bugs in KNOWN_BUGS.items() for index, bug in enumerate(bugs)}
    return sorted(found, key=lambda key: (key[0], order.get(key, 0)))


# -- the batch ------------------------------------------------------------------------


def load_state(out: Path, fingerprint: str) -> tuple[dict[str, StudentGrade], bool]:
    """The rows of the last run, by student, and whether the checks changed
    since; no rows when they did (those grades may no longer hold), when
    there is no state that can be read, or when its MAC does not hold: the
    state is read back as grades, so only what this program wrote counts."""
    try:
        state = json.loads((out / STATE_FILE).read_text(encoding="utf-8"))
        if state.get("version") != STATE_VERSION:
            return {}, False
        if not hmac.compare_digest(str(state.get("mac")), _mac(out, state["grader"], state["students"])):
            return {}, False
        if state.get("grader") != fingerprint:
            return {}, True
        return {student: StudentGrade.from_state(kept) for student, kept in state["students"].items()}, False
    except (OSError, ValueError, KeyError, TypeError):
        return {}, False


def save_state(out: Path, fingerprint: str, grades: dict[str, StudentGrade]) -> None:
    students = {student: grade.state() for student, grade in sorted(grades.items())}
    state = {"version": STATE_VERSION, "grader": fingerprint, "students": students,
             "mac": _mac(out, fingerprint, students)}
    _write_atomically(out / STATE_FILE, json.dumps(state, indent=1))


def _mac(out: Path, fingerprint: str, students: dict) -> str:
    """HMAC-SHA256 of the state's rows under the out folder's key (made on
    first use, readable by its owner only: workers, confined by Landlock,
    cannot read the out folder at all)."""
    path = out / KEY_FILE
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = secrets.token_bytes(32)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
            file.write(key)
    text = json.dumps({"grader": fingerprint, "students": students}, sort_keys=True)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def _results_intact(out: Path, row: StudentGrade) -> bool:
    """Is the student's results JSON the one written with their row?"""
    try:
        text = results_path(out, row.student).read_text(encoding="utf-8")
    except OSError:
        return False
    return bool(row.results_digest) and hmac.compare_digest(_sha256(text), row.results_digest)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file, so an interrupted run never leaves half a file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


def results_path(out: Path, student: str) -> Path:
    return out / RESULTS_FOLDER / f"{student}.json"


def run_batch(
    submissions: Path,
    out: Path,
    options: GradingOptions,
    jobs: int = 1,
    force: bool = False,
    progress: Callable[[int, int, int], None] | None = None,
) -> BatchResult:
    """Grade every student of ``submissions`` whose entry changed; write the
    CSV, the results JSON of each student graded and the state.

    Args:
        submissions: the folder with one entry per student.
        out: where the grades go (created if need be).
        options: seed and limits, the same for every student.
        jobs: processes grading students side by side.
        force: grade every student, changed or not.
        progress: called with ``(students done, students to grade, could
            not be graded)`` as students finish.
    """

    from grader.grading import preload
    from grader.sandbox import layers

    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS_FOLDER).mkdir(exist_ok=True)
    entries = list_entries(submissions, leave_out=out)
    fingerprint = _apart(grader_fingerprint)
    previous, checks_changed = ({}, False) if force else load_state(out, fingerprint)
    grades = {entry.student: previous[entry.student] for entry in entries
              if entry.student in previous and previous[entry.student].digest == entry.digest
              and _results_intact(out, previous[entry.student])}
    pending = sorted((entry for entry in entries if entry.student not in grades),
                     key=lambda entry: -entry.size)  # the largest first: the batch ends sooner
    retry: dict[str, StudentGrade] = {}
    broken = 0
    if progress:
        progress(0, len(pending), 0)
    if len(pending) > 1:  # imported once here, not once per student
        preload(CHAPTERS)

    def done(entry: Entry, grade: StudentGrade | None) -> None:
        nonlocal broken
        if grade is None:  # the grading process itself died (killed, out of memory)
            grade = _ungraded(entry, "the grader's process stopped while grading this submission; "
                                     "run the batch again")
            retry[entry.student] = grade  # in the CSV, not in the state: graded again next run
        else:
            grades[grade.student] = grade
        text = json.dumps(grade.results, indent=2)
        _write_atomically(results_path(out, grade.student), text)
        grade.results, grade.results_digest = None, _sha256(text)
        broken += bool(grade.note)
        if progress:
            progress(len(grades) + len(retry) - kept, len(pending), broken)

    kept = len(grades)
    try:
        grade_each(pending, options, max(1, jobs), done)
    finally:
        # Even when interrupted: what was graded is kept, and not graded again.
        save_state(out, fingerprint, grades)
    rows = [grades.get(entry.student) or retry[entry.student] for entry in entries]
    write_csv(out / CSV_FILE, rows)
    return BatchResult(rows, {entry.student for entry in pending}, checks_changed, out, options.seed,
                       isolation.missing(layers()))


def _apart(function: Callable[[], str]) -> str:
    """``function()``, computed in a forked child: what it reads (the
    reference solutions) never enters this process's memory, from which
    every student's workers are forked."""
    from grader.shards import fork_answering

    pid, read_fd = fork_answering(function)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


def student_seconds(options: GradingOptions) -> float:
    """How long one student's grade may take, whatever the submission does:
    every exercise's limit, every chapter's file loaded a few times (a line
    that hangs is skipped and the file run again), and a margin. Past it,
    the student's grading is stopped and the batch goes on."""
    limits = Limits.per_check(options.check_seconds)
    exercises = sum(len(chapter.exercises) for chapter in CHAPTERS)
    return exercises * limits.exercise_seconds + len(CHAPTERS) * 4 * limits.check_seconds + 30


def grade_each(entries: list[Entry], options: GradingOptions, jobs: int,
               done: Callable[[Entry, StudentGrade | None], None]) -> None:
    """Grade each entry in a process of its own, forked from this one, ``jobs``
    at a time, and call ``done(entry, grade)`` as each ends (``grade`` None:
    the process died).

    This process imports neither the checks nor the reference nor the known
    bugs: each student's grading starts from it, so nothing of another
    student's run is in its workers' memory. A student whose grading does
    not end within ``student_seconds`` is stopped, with everything it
    started, and gets a row that says so.
    """
    limit = student_seconds(options)
    queue = list(entries)
    running: dict[int, _Grading] = {}  # by the descriptor its answer arrives on
    reaping.adopt_orphans()
    try:
        while queue or running:
            while queue and len(running) < jobs:
                grading = _Grading.start(queue.pop(0), options, limit)
                running[grading.read_fd] = grading
            wait = max(0.0, min(grading.deadline for grading in running.values()) - time.monotonic())
            ready, _, _ = select.select(list(running), [], [], wait)
            for fd in ready:
                grading = running[fd]
                if grading.read():
                    continue
                del running[fd]
                done(grading.entry, grading.finish())
            for fd, grading in list(running.items()):
                if time.monotonic() > grading.deadline:
                    del running[fd]
                    grading.stop()
                    done(grading.entry, _ungraded(grading.entry, f"grading did not end within {limit:g} s "
                                                  "and was stopped (a submission that hangs the grader?)"))
    finally:
        for grading in running.values():  # interrupted: nothing is left running
            grading.stop()


@dataclass
class _Grading:
    """One student's grading, in a child process; its answer comes through a pipe."""

    entry: Entry
    pid: int
    read_fd: int
    deadline: float
    chunks: list[bytes] = field(default_factory=list)

    @classmethod
    def start(cls, entry: Entry, options: GradingOptions, seconds: float) -> _Grading:
        from grader.shards import fork_answering

        def compute() -> StudentGrade:
            import torch

            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the batch's to handle
            # Forked, it has none of OpenMP's threads, and would hang waiting on them.
            torch.set_num_threads(1)
            return grade_student(entry, options)

        pid, read_fd = fork_answering(compute)
        return cls(entry, pid, read_fd, time.monotonic() + seconds)

    def read(self) -> bool:
        """Read what has arrived; False at the end of the answer."""
        chunk = os.read(self.read_fd, 2**20)
        self.chunks.append(chunk)
        return bool(chunk)

    def finish(self) -> StudentGrade | None:
        """The grade the child sent (pickled by grader code: student code
        runs in its workers, whose inherited descriptors point nowhere), or
        None when it died first."""
        self.stop()
        data = b"".join(self.chunks)
        return pickle.loads(data) if data else None

    def stop(self) -> None:
        """End the child and everything below it; safe to call twice."""
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1
            reaping.stop_tree(self.pid)


def write_csv(path: Path, rows: list[StudentGrade]) -> None:
    """``student``, a column per exercise (``ch01/softmax``), ``total``, ``note``."""
    with open(path.with_name(f".{path.name}.partial"), "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(["student", *EXERCISE_KEYS, "total", "note"])
        for row in rows:
            writer.writerow([row.student, *(row.scores.get(key, 0) for key in EXERCISE_KEYS),
                             row.total, row.note])
    path.with_name(f".{path.name}.partial").replace(path)


# -- the summary ------------------------------------------------------------------------


def print_summary(result: BatchResult, console: Console, top_bugs: int = 10) -> None:
    """The class at a glance: per exercise how many submitted it and passed;
    the catalog's known bugs by how many students made them; who could not
    be graded and why; where the files are. Fits 80 columns (a pipe, a log)."""
    rows = result.grades
    if result.unprotected:  # first: an instructor must know what the class's code could reach
        console.print(Text(f"warning: {result.unprotected}", style="bold yellow"))
    table = Table(title=f"mha-course batch · {len(rows)} students", title_justify="left",
                  title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("exercise", no_wrap=True)
    for name in ("points", "submitted", "passed", "rate"):  # rate: passed / submitted the chapter
        table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    for chapter in CHAPTERS:
        submitted = [row for row in rows if chapter.id in row.graded]
        if not submitted:
            continue
        table.add_row(Text(chapter.id, style="bold"))
        for exercise in chapter.exercises:
            if exercise.optional:  # worth 0 points: a score cannot tell written and right from left alone
                continue
            key = exercise_key(chapter, exercise.name)
            passed = sum(row.scores.get(key, 0) == exercise.points for row in submitted)
            rate = passed / len(submitted)
            table.add_row(exercise.name, str(exercise.points), str(len(submitted)), str(passed),
                          Text(f"{rate:.0%}", style="green" if rate >= 0.8 else "red" if rate < 0.5 else ""))
    if table.row_count:
        console.print(table)
    _print_bugs(rows, console, top_bugs)
    unusable = [row for row in rows if row.note]
    for row in unusable:
        # Text, not markup: a reason may quote a file name with "[...]" in it.
        console.print(Text(f"✗ {row.student}: {row.note}", style="yellow"))
    if result.checks_changed:
        console.print(Text("the checks, the known bugs or the solutions changed since the last run: "
                           "every student was graded again", style="yellow"))
    mean = sum(row.total for row in rows) / len(rows) if rows else 0.0
    kept = len(rows) - len(result.graded_now)
    console.print(Text(f"{len(result.graded_now)} graded, {kept} unchanged (kept; --force regrades), "
                       f"{len(unusable)} with a note", style="bold"))
    console.print(Text(f"class mean {mean:.1f} / {COURSE_POINTS} points", style="bold"))
    console.print(Text(f"wrote {result.out / CSV_FILE} and {result.out / RESULTS_FOLDER}/STUDENT.json "
                       f"({seeds_used(result)})", style="dim"))


def seeds_used(result: BatchResult) -> str:
    """The seed(s) the class's rows were graded with, for the summary: this
    run's seed names only the rows graded now, and a re-run that graded
    nobody again printing it would pass off the kept rows as graded with it."""
    kept = sorted({row.seed for row in result.grades
                   if row.student not in result.graded_now and row.seed is not None})
    kept_seeds = f"seed{'s' if len(kept) > 1 else ''} {', '.join(map(str, kept))}"
    if not result.graded_now:
        return f"nothing graded again: results kept, graded with {kept_seeds}" if kept else "nothing graded"
    if not kept or kept == [result.seed]:
        return f"seed {result.seed}"
    return f"seed {result.seed}; the results kept were graded with {kept_seeds}"


def _print_bugs(rows: list[StudentGrade], console: Console, top: int) -> None:
    """The known bugs most students made, as the catalog names them, each
    with its hint below it."""
    from grader.known_bugs import KNOWN_BUGS

    counts = Counter(bug for row in rows for bug in set(map(tuple, row.bugs)))
    if not counts:
        return
    hints = {(chapter, bug.exercise, bug.name): bug.hint for chapter, bugs in KNOWN_BUGS.items() for bug in bugs}
    table = Table(title="most frequent known bugs", title_justify="left", title_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("students", justify="right", no_wrap=True)
    table.add_column("known bug (exercise: name) and its hint", ratio=1)
    # Most students first; a tie in catalog order, as the CSV's columns.
    ranked = sorted(counts.items(), key=lambda item: -item[1])[:top]
    for (chapter, exercise, name), count in ranked:
        table.add_row(str(count), Text.assemble((f"{chapter} {exercise}: {name}", "bold"), "\n",
                                                (hints.get((chapter, exercise, name), ""), "dim")))
    console.print(table)
