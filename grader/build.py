"""Generate everything students receive from the single source of truth.

``solutions/chNN_topic.py`` holds the reference code; the parts a student
writes sit between ``# BEGIN SOLUTION`` and ``# END SOLUTION``. The build
turns each solution file into the stub ``exercises/chNN_topic.py`` and runs
each chapter's ``figures.py`` to draw the lesson's figures. In each lesson
it writes, between two marker lines, what each exercise's checks try, from
the checks' docstrings (``grader.lesson_checks``); the rest of the lesson
is the author's. The notebooks carry the lesson so written. Nothing it
writes is edited by hand: ``mha-course build --check`` (and a test) fail
when a committed file differs from what the build writes now.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from pathlib import Path

from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter
from grader.lesson_checks import lesson_text
from grader.notebooks import notebook_text

# What the build last wrote into exercises/, by file name: a sha256 of each
# text. A file there that matches neither its record nor the build's text
# now was edited by someone: it holds work, and the build leaves it alone.
RECORD = ".build-record.json"

BEGIN = "# BEGIN SOLUTION"
END = "# END SOLUTION"
STUB_BODY = ("# YOUR CODE HERE", "raise NotImplementedError")


class MarkerError(ValueError):
    """Solution markers that do not pair up."""


def stub_source(solution: str, filename: str = "<solution>") -> str:
    """The solution's text with each marked block replaced by a stub body.

    Everything outside the markers (imports, signatures, docstrings, shape
    comments) is kept as it is; each block becomes ``raise
    NotImplementedError`` at the indentation of its ``# BEGIN SOLUTION``.
    """
    lines_out: list[str] = []
    opened_at = 0  # line number of the open BEGIN marker, 0 when outside
    for number, line in enumerate(solution.splitlines(keepends=True), start=1):
        marker = line.strip()
        if marker == BEGIN:
            if opened_at:
                raise MarkerError(
                    f"{filename}:{number}: {BEGIN} inside the block opened at line {opened_at}"
                )
            opened_at = number
            indent = line[: len(line) - len(line.lstrip())]
            lines_out.extend(f"{indent}{stub_line}\n" for stub_line in STUB_BODY)
        elif marker == END:
            if not opened_at:
                raise MarkerError(f"{filename}:{number}: {END} without a {BEGIN}")
            opened_at = 0
        elif not opened_at:
            lines_out.append(line)
    if opened_at:
        raise MarkerError(f"{filename}:{opened_at}: {BEGIN} is never closed")
    return "".join(lines_out)


def _chapter_figures(chapter: Chapter, root: Path) -> dict[Path, str]:
    """Run ``chapters/NN_topic/figures.py`` and return ``{path: svg text}``."""
    folder = root / "chapters" / chapter.folder
    script = folder / "figures.py"
    if not script.exists():
        return {}
    spec = importlib.util.spec_from_file_location(f"figures_{chapter.module}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {folder / "figures" / name: text for name, text in module.figures().items()}


def generated_files(root: Path = COURSE_ROOT, figures: bool = True) -> dict[Path, str]:
    """Every file the build writes, with the text it writes: the record of
    the exercises (``RECORD``) among them."""
    files: dict[Path, str] = {}
    for chapter in CHAPTERS:
        solution = chapter.solution(root)
        stub = stub_source(solution.read_text(encoding="utf-8"), str(solution.relative_to(root)))
        lesson = files[chapter.lesson(root)] = lesson_text(chapter, root)
        files[chapter.stub(root)] = stub
        files[chapter.notebook(root)] = notebook_text(chapter, stub, root, lesson=lesson)
        if figures:
            files.update(_chapter_figures(chapter, root))
    exercises = {path.name: _digest(text) for path, text in files.items() if path.parent.name == "exercises"}
    files[root / "exercises" / RECORD] = _record_text(exercises)
    return files


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _record_text(digests: dict[str, str]) -> str:
    return json.dumps(dict(sorted(digests.items())), indent=1) + "\n"


def _recorded(folder: Path) -> dict[str, str] | None:
    """The record in ``folder`` of what the build last wrote there; None if
    there is none to trust."""
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_stubs(files: dict[Path, str], root: Path, folder: Path) -> list[tuple[Chapter, Path]]:
    """Each chapter's stub as the build writes it (``files``, from
    ``generated_files(root)``), written into ``folder``: the ``(chapter,
    path)`` pairs a grade of the untouched stubs takes. Not exercises/ as it
    is, which may hold someone's work."""
    targets = []
    for chapter in CHAPTERS:
        path = folder / chapter.file_name
        path.write_text(files[chapter.stub(root)], encoding="utf-8")
        targets.append((chapter, path))
    return targets


def edited_files(files: dict[Path, str]) -> list[Path]:
    """The exercise files on disk that the build would change but did not
    write as they are: someone's work, which ``write_files`` leaves alone.
    Without a record to go by, every exercise file that would change counts."""
    records: dict[Path, dict[str, str] | None] = {}
    edited = []
    for path, text in files.items():
        if path.name == RECORD or path.suffix not in (".py", ".ipynb") or not path.is_file():
            continue
        if path.parent not in records:
            if path.parent.name != "exercises":
                continue
            records[path.parent] = _recorded(path.parent)
        on_disk = path.read_text(encoding="utf-8", errors="replace")
        record = records[path.parent]
        if on_disk != text and (record is None or record.get(path.name) != _digest(on_disk)):
            edited.append(path)
    return edited


def solution_notebooks(folder: Path, root: Path = COURSE_ROOT) -> dict[Path, str]:
    """The chapters' notebooks with the reference code filled in (for
    instructors), to be written into ``folder``, with a copy of each file
    their lessons link to (the figures) under ``folder``.

    ``folder`` may be anywhere, or be moved: a link out of it, like the
    ``../chapters/`` of ``exercises/``, would break. The copies keep their
    place in the course (``chapters/01_self_attention/figures/x.svg``), so
    two chapters' figures never collide. Copies rather than figures embedded
    as cell attachments: every notebook viewer follows a relative link, not
    every one shows an attached SVG, and the figures stay files to open.
    """
    files = {}

    def copy(target: Path) -> str:
        if not target.is_relative_to(root):
            raise ValueError(f"a lesson links to {target}, outside the course")
        place = target.relative_to(root)
        files[folder / place] = target.read_text(encoding="utf-8")  # SVG: text
        return place.as_posix()

    for chapter in CHAPTERS:
        solution = chapter.solution(root).read_text(encoding="utf-8")
        files[folder / f"{chapter.module}.ipynb"] = notebook_text(chapter, solution, root, "solutions", copy,
                                                                  lesson_text(chapter, root))
    return files


def stale_files(files: dict[Path, str]) -> list[Path]:
    """The files whose text on disk differs from what the build writes."""
    return [
        path
        for path, text in files.items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]


def write_files(files: dict[Path, str], force: bool = False) -> tuple[list[Path], dict[Path, Path | None]]:
    """Write the files that changed, except edited exercises (``edited_files``).

    Returns the paths written, and the edited files: each left alone (None),
    or with ``force`` overwritten after a copy was kept (the copy's path).
    The record keeps, for a file left alone, what the build wrote before.
    """
    edited: dict[Path, Path | None] = dict.fromkeys(edited_files(files))
    if force:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for path in edited:
            copy = path.with_name(f"{path.name}.{stamp}.bak")
            copy.write_bytes(path.read_bytes())
            edited[path] = copy
    kept = {path for path, copy in edited.items() if copy is None}
    files = dict(files)
    for path in kept:
        record_path = path.parent / RECORD
        record = json.loads(files[record_path])
        record[path.name] = (_recorded(path.parent) or {}).get(path.name, "")
        files[record_path] = _record_text(record)
    changed = [path for path in stale_files(files) if path not in kept]
    for path in changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path], encoding="utf-8")
    return changed, edited
