"""``mha-course release DIR``: write the student edition of the course.

The edition is what students receive: the lessons (``chapters/``), the
stubs and notebooks (``exercises/``), the grader and its checks; the
lessons' comments that name known bugs and the instructor's own files
(``LEFT_OUT_FILES``) stay here. It holds no
code that computes an exercise's answer: no ``solutions/`` folder, no
independent oracles (each chapter's ``oracles.py``), and the known-bug catalog keeps
each bug's hint but not its ``old``/``new`` lines (they are edits of
solution lines). What the checks ask of the reference and the oracles is
recorded instead (``grader.recorded``): the reference solutions are graded
once per seed, in processes forked from this one, with every call written
down, and the recordings go to ``DIR/grader/recorded/`` only; nothing
generated lands in the instructor's tree.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from grader import recorded
from grader.catalog import CHAPTERS, COURSE_ROOT

# What the edition copies from the course, and what it leaves out of them.
COPIED = ("chapters", "exercises", "grader")
LEFT_OUT = ("__pycache__", ".ipynb_checkpoints", ".pytest_cache")
LEFT_OUT_OF_GRADER = ("oracles.py", "recorded", "templates")
# Of a chapter's grading package, its oracles, and its bugs' code (the
# edition writes the bugs' hints alone, ``_write_bug_hints``).
LEFT_OUT_OF_A_CHAPTER = ("bugs.py", "oracles.py")
LEFT_OUT_SUFFIXES = (".pyc", ".pyo")
# The instructor's own: the grader's tour cites tests/ and solutions/, and
# the build's record belongs to a build the edition refuses to run.
LEFT_OUT_FILES = (Path("grader", "README.md"), Path("exercises", ".build-record.json"))
# A lesson's pitfalls name the catalog's bugs in comments, for
# tests/test_lessons.py; a student reading the raw file has no use for them.
# A tag alone on its line goes with its line; one after text, with the
# spaces before it.
KNOWN_BUGS_TAG_LINE = re.compile(r"^[ \t]*<!--\s*known bugs:(?:(?!-->).)*-->[ \t]*\n", re.MULTILINE | re.DOTALL)
KNOWN_BUGS_TAG = re.compile(r"[ \t]*<!--\s*known bugs:(?:(?!-->).)*-->", re.DOTALL)
# The student README: a template of its own, with the sections it shares
# with the course's README copied in, so that no sentence is written twice.
STUDENT_README = Path(__file__).resolve().parent / "templates" / "student-README.md"
SECTION_MARK = re.compile(r"^<!-- section: (## .+) -->$", re.MULTILINE)


class ReleaseError(RuntimeError):
    """The edition cannot be written (a used folder, a failing reference)."""


@dataclass
class Release:
    """What ``write_edition`` wrote."""

    folder: Path
    seeds: list[int]
    files: int
    recorded_bytes: dict[str, int]  # chapter id -> size of its recording


def write_edition(folder: Path, seeds: list[int] | None = None, jobs: int = 1,
                  root: Path = COURSE_ROOT) -> Release:
    """Write the student edition into ``folder`` (new, or empty).

    Args:
        folder: where the edition goes.
        seeds: the seeds to record; four fresh ones when None.
        jobs: processes recording seeds side by side.
        root: the instructor's tree.
    """
    # Resolved, links included: an edition inside the course (exercises/x)
    # would copy itself into itself; one around it, the course into it.
    folder, root = folder.resolve(), root.resolve()
    if folder.is_relative_to(root) or root.is_relative_to(folder):
        raise ReleaseError(f"{folder} is inside the course or holds it: write the edition "
                           f"outside {root}")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ReleaseError(f"{folder} exists and is not an empty folder")
    seeds = sorted(set(seeds)) if seeds else sorted({secrets.randbelow(2**31) for _ in range(4)})
    recordings = _record(seeds, jobs, root)

    files = _copy_course(folder, root)
    files += _write_bug_hints(folder)
    target = folder / "grader" / "recorded"
    target.mkdir(parents=True, exist_ok=True)
    sizes = {chapter_id: recording.save(target / f"{chapter_id}.rec")
             for chapter_id, recording in recordings.items()}
    (target / recorded.INDEX).write_text(
        json.dumps({"format": recorded.FORMAT, "seeds": seeds}, indent=1) + "\n", encoding="utf-8")
    return Release(folder, seeds, files + len(sizes) + 1, sizes)


# -- recording ---------------------------------------------------------------------------


def _record(seeds: list[int], jobs: int, root: Path) -> dict[str, recorded.Recording]:
    """Grade the reference solutions with each seed; merge what was recorded."""
    merged: dict[str, recorded.Recording] = {}
    if jobs <= 1 or len(seeds) == 1:
        results = map(_record_seed, seeds, [root] * len(seeds))
        return _merge(merged, results)
    from grader.side_by_side import forked_pool

    with forked_pool(min(jobs, len(seeds))) as pool:
        return _merge(merged, pool.map(_record_seed, seeds, [root] * len(seeds)))


def _merge(merged: dict[str, recorded.Recording], results) -> dict[str, recorded.Recording]:
    for per_chapter in results:
        for chapter_id, data in per_chapter.items():
            recording = recorded.Recording.from_bytes(data, chapter_id)
            into = merged.setdefault(chapter_id, recorded.Recording())
            into.answers.update(recording.answers)
            into.lookalikes.update(recording.lookalikes)
    return merged


def _record_seed(seed: int, root: Path) -> dict[str, bytes]:
    """Grade every chapter's reference with ``seed``, recording; every check
    must pass (a recording of a failing reference would grade wrongly)."""
    from grader.grading import grade

    targets = [(chapter, chapter.solution(root)) for chapter in CHAPTERS]
    recorder = recorded.Recorder()
    report = grade(targets, seed=seed, mode=recorder)
    failed = [f"{result.chapter.id} {check.check}: {check.message}"
              for result in report.exercises for check in result.failed_checks]
    if failed:
        raise ReleaseError(f"the reference fails with seed {seed}, so nothing can be recorded: "
                           + "; ".join(failed[:3]))
    # Bytes, not objects, cross back to the parent.
    return {chapter_id: recording.to_bytes() for chapter_id, recording in recorder.recordings.items()}


# -- files -------------------------------------------------------------------------------


def _copy_course(folder: Path, root: Path) -> int:
    """Copy the lessons, exercises and grader; the README and pyproject
    adapted. Not copied: solutions/, tests/, the oracles, the bugs' code,
    old recordings."""
    count = 0
    for top in COPIED:
        for path in sorted((root / top).rglob("*")):
            relative = path.relative_to(root)
            if (not path.is_file() or any(part in LEFT_OUT for part in relative.parts)
                    or path.suffix in LEFT_OUT_SUFFIXES or relative in LEFT_OUT_FILES
                    or relative.parts[0] == "grader" and (
                        relative.parts[1] in LEFT_OUT_OF_GRADER
                        or relative.parts[1] == "chapters" and path.name in LEFT_OUT_OF_A_CHAPTER)):
                continue
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            if top == "chapters" and path.suffix == ".md":
                (folder / relative).write_text(student_lesson(path.read_text(encoding="utf-8")),
                                               encoding="utf-8")
            elif top == "exercises" and path.suffix == ".ipynb":
                (folder / relative).write_text(student_notebook(path.read_text(encoding="utf-8")),
                                               encoding="utf-8")
            else:
                shutil.copyfile(path, folder / relative)
            count += 1
    (folder / "README.md").write_text(student_readme((root / "README.md").read_text(encoding="utf-8")),
                                      encoding="utf-8")
    (folder / "pyproject.toml").write_text(
        student_pyproject((root / "pyproject.toml").read_text(encoding="utf-8")), encoding="utf-8")
    return count + 2


def student_lesson(lesson: str) -> str:
    """A lesson as students get it: without its ``<!-- known bugs: ... -->``
    tags (a rendered lesson does not show them; its raw text does)."""
    return KNOWN_BUGS_TAG.sub("", KNOWN_BUGS_TAG_LINE.sub("", lesson))


def student_notebook(text: str) -> str:
    """A chapter's notebook with its lesson's cells as ``student_lesson``
    makes them, written as the build writes notebooks."""
    import nbformat

    notebook = nbformat.reads(text, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = student_lesson(cell.source)
    return nbformat.writes(notebook) + "\n"


def student_readme(course_readme: str, template: str | None = None) -> str:
    """The edition's README: ``templates/student-README.md``, each of its
    ``<!-- section: ## Heading -->`` lines replaced by that section of the
    course's README (up to the next ``## ``). Raises ReleaseError for a
    section the course's README lacks."""
    template = STUDENT_README.read_text(encoding="utf-8") if template is None else template

    def section(match: re.Match) -> str:
        heading = match.group(1)
        start = course_readme.find(f"\n{heading}\n")
        if start < 0:
            raise ReleaseError(f"README.md has no section {heading!r} for the student edition's README")
        end = course_readme.find("\n## ", start + 1)
        return course_readme[start + 1:end if end >= 0 else None].rstrip("\n")

    return SECTION_MARK.sub(section, template)


def student_pyproject(text: str) -> str:
    """The project file for students: no instructor's extras (``dev``), no
    test settings (the edition has no tests), and the recordings as package
    data (so a non-editable install carries them too)."""
    kept, section = [], ""
    for line in text.splitlines():
        if line.startswith("["):
            section = line.strip()
        if section == "[tool.pytest.ini_options]":
            continue
        if section == "[project.optional-dependencies]" and not (
                line.startswith(("[", "notebook")) or not line.strip()):
            continue  # the dev extra and the comments on it
        if section == "[tool.setuptools.package-data]" and line.startswith('"grader" ='):
            line = '"grader" = ["recorded/*"]'
        kept.append(line)
    text = "\n".join(kept).rstrip("\n") + "\n"
    if '"grader" = ["recorded/*"]' not in text:
        raise ReleaseError('pyproject.toml has no "grader" package data to replace')
    return text


def _write_bug_hints(folder: Path) -> int:
    """Each ``grader/chapters/chNN/bugs.py`` with each known bug's hint and error pattern,
    not its code: the ``old`` and ``new`` lines are solution lines."""
    from grader.known_bugs import KNOWN_BUGS

    for chapter in CHAPTERS:
        lines = [f'"""Known bugs of {chapter.id}: the hints a student reads. The student edition',
                 'keeps no code of them (each is an edit of a reference solution)."""', "",
                 "from grader.chapters import KnownBug", "", "BUGS = ("]
        for bug in KNOWN_BUGS.get(chapter.id, ()):
            lines.append(f"    KnownBug({bug.exercise!r}, {bug.name!r},")
            lines.append(f"             {bug.hint!r},")
            lines.append(f"             old='', new='', error={bug.error!r}),")
        lines.append(")")
        path = chapter.bugs(folder)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(CHAPTERS)


WINDOW = 3  # consecutive code lines of a solution that count as revealing it


def solution_blocks(root: Path = COURSE_ROOT, given: list[str] | None = None) -> list[list[str]]:
    """The code lines of every ``# BEGIN SOLUTION`` ... ``# END SOLUTION``
    block of the solutions, as ``_code_lines`` compares them. ``given``,
    when a list, receives the code lines outside the blocks (what every
    student is given)."""
    blocks = []
    for path in sorted((root / "solutions").glob("ch*.py")):
        block: list[str] | None = None
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() == "# BEGIN SOLUTION":
                block = []
            elif line.strip() == "# END SOLUTION":
                blocks.append(block or [])
                block = None
            elif block is not None:
                block.extend(_code_lines(line))
            elif given is not None:
                given.extend(_code_lines(line))
    return blocks


def _code_lines(text: str) -> list[str]:
    """Each line's code as a comparison sees it: no comment, no doctest
    prompt, one space wherever there was space (a solution line pasted
    with other comments or aligned otherwise is the same line)."""
    lines = (" ".join(_without_comment(line).strip().removeprefix(">>> ").removeprefix("... ").split())
             for line in text.splitlines())
    return [line for line in lines if line]


def _without_comment(line: str) -> str:
    """``line`` up to a ``#`` that is not inside a string literal."""
    quote, escaped = "", False
    for at, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote:
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#":
            return line[:at]
    return line


def _text_lines(path: Path) -> list[str]:
    """A file's code lines; a notebook's are those of its cells."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".ipynb":
        cells = json.loads(text).get("cells", [])
        text = "\n".join("".join(cell.get("source", "")) for cell in cells)
    return _code_lines(text)


def revealing_passages(folder: Path, root: Path = COURSE_ROOT) -> list[str]:
    """``file: passage`` for each passage of a solution found in ``folder``
    (the edition, or one file):
    three consecutive code lines of a solution block (the whole block when
    it is shorter); and any known bug's ``old`` or ``new`` text in the
    edition's bug catalog. Shorter passages are not counted: ``if mask is
    not None:`` followed by a ``masked_fill`` is everyone's, not the solution's."""
    from grader.known_bugs import KNOWN_BUGS

    given: list[str] = []
    passages = {tuple(block[i:i + WINDOW]) for block in solution_blocks(root, given)
                for i in range(max(1, len(block) - WINDOW + 1)) if block}
    # A block shorter than the window may be a line the solution gives
    # outside its blocks too (``return self.forward_with_cache(x)[0]``).
    passages -= _windows(given)
    # An edit is found as a string literal of its own (a hint may name
    # ``-1e9`` in its prose; the catalog's code held it as a literal).
    edits = {text for bugs in KNOWN_BUGS.values() for bug in bugs
             for text in (bug.old, bug.new) if len(text.strip()) >= 10}
    found = []
    for path in [folder] if folder.is_file() else sorted(folder.rglob("*")):
        if not path.is_file() or path.suffix not in (".py", ".ipynb", ".md", ".toml", ".txt", ".ini", ".json"):
            continue
        where = path.relative_to(folder) if folder.is_dir() else path.name
        found += [f"{where}: {' / '.join(passage)}" for passage in sorted(passages & _windows(_text_lines(path)))]
        if path.suffix == ".py":
            text = path.read_text(encoding="utf-8")
            found += [f"{where}: {edit}" for edit in sorted(edits)
                      if any(literal in text for literal in (repr(edit), f'"{edit}"', f"'{edit}'"))]
    return found


def _windows(lines: list[str]) -> set[tuple[str, ...]]:
    """Every run of one to ``WINDOW`` consecutive lines."""
    return {tuple(lines[i:i + size]) for size in range(1, WINDOW + 1) for i in range(len(lines) - size + 1)}
