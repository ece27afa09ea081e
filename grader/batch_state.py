"""What a batch keeps in its out folder between runs: each student's row
(``StudentGrade``), the state file of the rows and the seeds they were
graded with, signed so that only what the batch wrote is read back, and the
fingerprint of the checks, whose change makes every grade stale.

An out folder holds the grades of one class (its SUBMISSIONS folder) and
one set of chapters (``Owner``), which the state records: a batch of
another class or of other chapters refuses it (``claim``) rather than
replace or mix its grades, and by default each writes a folder of its own
(``default_out``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter

CSV_FILE = "grades.csv"
STATE_FILE = "batch-state.json"
RESULTS_FOLDER = "results"
STATE_VERSION = 4  # 3: each row keeps the seed it was graded with; 4: the class and chapters
KEY_FILE = ".batch-key"  # the key of the state's MAC, readable by its owner only


@dataclass
class StudentGrade:
    """One row of the class: what a student scored and why.

    Attributes:
        student: the student's id.
        digest: the entry's content hash when it was graded.
        scores: ``{"ch01/softmax": points scored}`` for every exercise of the
            chapters the batch grades.
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


# -- whose grades an out folder holds ------------------------------------------------


class OutFolderTaken(Exception):
    """The out folder holds grades this batch did not write: another class's,
    other chapters', or files no batch recorded. The message says which, in
    one line."""


@dataclass(frozen=True)
class Owner:
    """Whose grades an out folder holds: a class, by its SUBMISSIONS folder
    (resolved), and the ids of the chapters graded."""

    submissions: str
    chapters: tuple[str, ...]

    @classmethod
    def of(cls, submissions: Path, chapters: Sequence[Chapter]) -> Owner:
        return cls(str(submissions.resolve()), tuple(chapter.id for chapter in chapters))


def default_out(submissions: Path, chapters: Sequence[Chapter] = CHAPTERS) -> Path:
    """The out folder of a class when ``--out`` is not given: beside
    SUBMISSIONS, named after it (``class-a/``: ``class-a-grades/``), so two
    classes of one folder never share one; a batch of some chapters only
    has its own (``class-a-grades-ch01-ch04/``), so this week's CSV does not
    replace last week's."""
    folder = submissions.resolve()
    some = "" if list(chapters) == list(CHAPTERS) else "".join(f"-{chapter.id}" for chapter in chapters)
    return folder.parent / f"{folder.name or 'class'}-grades{some}"


def claim(out: Path, owner: Owner) -> None:
    """Check that ``out`` may take ``owner``'s grades: it holds none yet, or
    the state of a batch of the same class and chapters (a re-run). Writes
    nothing.

    Raises:
        OutFolderTaken: it holds another class's grades, other chapters',
            or a grades.csv or results/ that no batch recorded (a gradebook
            export, an older version's run): replacing it would lose them.
    """
    recorded = recorded_owner(out)
    if recorded is None:
        written = [name for name in (CSV_FILE, RESULTS_FOLDER) if _holds(out / name)]
        if written:
            raise OutFolderTaken(f"{out} holds {' and '.join(written)}, which no batch recorded as its own: "
                                 "choose another folder with --out")
    elif recorded.submissions != owner.submissions:
        raise OutFolderTaken(f"{out} holds the grades of another class ({recorded.submissions}): "
                             "choose another folder with --out")
    elif recorded.chapters != owner.chapters:
        raise OutFolderTaken(f"{out} holds this class's grades of {', '.join(recorded.chapters)}, not of "
                             f"{', '.join(owner.chapters)}: choose another folder with --out")


def recorded_owner(out: Path) -> Owner | None:
    """Whose grades the state in ``out`` says they are, whether or not its
    MAC holds (refusing a folder is the safe side); None when there is no
    state of this version."""
    try:
        return _owner_in(json.loads((out / STATE_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def _owner_in(state) -> Owner | None:
    """The owner a state file's JSON names; None if it names none (another version's)."""
    try:
        if state.get("version") != STATE_VERSION:
            return None
        return Owner(str(state["owner"]["submissions"]), tuple(map(str, state["owner"]["chapters"])))
    except (KeyError, TypeError, AttributeError):
        return None


def _holds(path: Path) -> bool:
    """A file (a link, anything), or a folder with something in it."""
    try:
        if path.is_dir():
            return any(path.iterdir())
        return path.exists() or path.is_symlink()
    except OSError:
        return True  # there, and unreadable: not ours to replace


# -- the rows, from one run to the next ----------------------------------------------


def grader_fingerprint(root: Path = COURSE_ROOT) -> str:
    """sha256 of what decides a verdict: the catalog, the checks, the known
    bugs and the reference solutions. When one changes (a new check, a fixed
    reference), earlier grades no longer hold and every student is graded
    again. The grader's machinery is left out: a change there that alters
    verdicts is rare, and ``--force`` is there for it."""
    digest = hashlib.sha256()
    files = sorted([root / "grader" / "catalog.py", *(root / "grader" / "chapters").glob("ch*/test_*.py"),
                    *(root / "grader" / "chapters").glob("ch*/bugs.py"), *(root / "solutions").glob("*.py")])
    for file in files:
        digest.update(file.relative_to(root).as_posix().encode() + b"\n")
        digest.update(file.read_bytes())
    return digest.hexdigest()


def load_state(out: Path, fingerprint: str, owner: Owner) -> tuple[dict[str, StudentGrade], bool]:
    """The rows of the last run, by student, and whether the checks changed
    since; no rows when they did (those grades may no longer hold), when
    there is no state that can be read, when its MAC does not hold (the
    state is read back as grades, so only what this program wrote counts),
    or when they are another owner's (a row of other chapters lacks these
    chapters' scores: ``claim`` refuses such a folder first)."""
    try:
        state = json.loads((out / STATE_FILE).read_text(encoding="utf-8"))
        if _owner_in(state) != owner:  # of another version, class or set of chapters
            return {}, False
        if not hmac.compare_digest(str(state.get("mac")), _mac(out, state["grader"], owner, state["students"])):
            return {}, False
        if state.get("grader") != fingerprint:
            return {}, True
        return {student: StudentGrade.from_state(kept) for student, kept in state["students"].items()}, False
    except (OSError, ValueError, KeyError, TypeError):
        return {}, False


def save_state(out: Path, fingerprint: str, owner: Owner, grades: dict[str, StudentGrade]) -> None:
    students = {student: grade.state() for student, grade in sorted(grades.items())}
    state = {"version": STATE_VERSION, "grader": fingerprint, "owner": asdict(owner), "students": students,
             "mac": _mac(out, fingerprint, owner, students)}
    write_atomically(out / STATE_FILE, json.dumps(state, indent=1))


def _mac(out: Path, fingerprint: str, owner: Owner, students: dict) -> str:
    """HMAC-SHA256 of the state's owner and rows under the out folder's key
    (made on first use, readable by its owner only: workers, confined by
    Landlock, cannot read the out folder at all)."""
    path = out / KEY_FILE
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = secrets.token_bytes(32)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
            file.write(key)
    text = json.dumps({"grader": fingerprint, "owner": asdict(owner), "students": students}, sort_keys=True)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def results_intact(out: Path, row: StudentGrade) -> bool:
    """Is the student's results JSON the one written with their row?"""
    try:
        text = results_path(out, row.student).read_text(encoding="utf-8")
    except OSError:
        return False
    return bool(row.results_digest) and hmac.compare_digest(sha256_text(text), row.results_digest)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file, so an interrupted run never leaves half a file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


def results_path(out: Path, student: str) -> Path:
    return out / RESULTS_FOLDER / f"{student}.json"
