"""Chapter notebooks: written from the course's sources, read back as code.

A chapter's notebook is built from three sources: the lesson
(``chapters/NN_topic/README.md``, one markdown cell per section), the
chapter's code (the stub, or the solution for instructors: a setup cell with
its imports, then one cell per exercise) and ``chapters/NN_topic/notebook.py``
(a "try it" cell after each exercise and a plot cell). The last cell grades
the saved notebook. A try or plot cell that calls an exercise not written yet
says so in a line instead of raising, so that Run All reaches the grade.

Tags in each cell's metadata say what it is. When a notebook is graded, the
code cells run in a worker as one module, except those tagged ``try``,
``plot`` and ``grade``: trying, plotting and grading are not the student's
answer. IPython syntax (``%timeit``, ``!pip``) is blanked with a note, since
the worker runs plain Python.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from grader.catalog import Chapter

if TYPE_CHECKING:
    import nbformat

SETUP, EXERCISE, TRY, PLOT, GRADE, LESSON = "setup", "exercise", "try", "plot", "grade", "lesson"
NOT_GRADED = frozenset({TRY, PLOT, GRADE})  # cells whose code is never run by the grader
METADATA_KEY = "mha_course"  # cell and notebook metadata: {"exercise": name} / {"chapter": id}
CELL_MARK = re.compile(r"^# %% (try (\w+)|plot)\s*$")
NOT_WRITTEN = "Not written yet: a function this cell calls still raises NotImplementedError."
NOT_DRAWN = "Not drawn yet: {error.name} is made by a cell above, which has not run to the end."
RAISES = "raises-exception"  # the tag of a cell whose error does not stop Run All


class NotebookError(ValueError):
    """A notebook that cannot be read; the message is one line for the student."""


# -- writing ------------------------------------------------------------------


def notebook_text(chapter: Chapter, code: str, root: Path, edition: str = "exercises",
                  link: Callable[[Path], str] | None = None, lesson: str | None = None) -> str:
    """The chapter's notebook as JSON text, the same bytes for the same sources.

    Args:
        chapter: the chapter.
        code: the chapter's module: the stub, or the solution.
        root: the course folder (lessons and extra cells are read from it).
        edition: "exercises" or "solutions", recorded in the metadata.
        link: what the notebook links to for a file the lesson links to (a
            figure), given that file's path; None for its path from
            ``exercises/``, where the built notebooks live.
        lesson: the lesson's text, as the build writes it; None for its
            ``README.md`` as it is.
    """
    import nbformat  # here: grading a .py file need not import it

    folder = root / "chapters" / chapter.folder
    extra = extra_cells(folder / "notebook.py")
    unknown = sorted(set(extra) - {exercise.name for exercise in chapter.exercises} - {"plot"})
    if unknown:
        raise ValueError(f"chapters/{chapter.folder}/notebook.py tries {', '.join(unknown)}, "
                         f"which {chapter.id} has no exercise of")
    cells: list[nbformat.NotebookNode] = []

    def add(cell: nbformat.NotebookNode, kind: str, exercise: str | None = None) -> None:
        cell.id = f"{kind}-{len(cells):02d}"  # stable ids: the build writes the same file twice
        # An error in a try or plot cell (a half-written exercise's) does not
        # stop Run All in JupyterLab or nbconvert: they honour this tag.
        cell.metadata["tags"] = [kind, RAISES] if kind in (TRY, PLOT) else [kind]
        if exercise:
            cell.metadata[METADATA_KEY] = {"exercise": exercise}
        cells.append(cell)

    if link is None:
        link = partial(_relative_link, start=root / "exercises")
    if lesson is None:
        lesson = (folder / "README.md").read_text(encoding="utf-8")
    sections = lesson_sections(lesson, folder, link)
    add(nbformat.v4.new_markdown_cell(sections[0] + "\n\n" + _how_to(chapter)), LESSON)
    for section in sections[1:]:
        add(nbformat.v4.new_markdown_cell(section), LESSON)
    setup, parts = split_code(code, [exercise.name for exercise in chapter.exercises])
    add(nbformat.v4.new_markdown_cell("## Exercises\n\nRun this cell first: the imports every "
                                      "exercise uses, and the chapter's conventions."), LESSON)
    add(nbformat.v4.new_code_cell(setup), SETUP)
    for exercise in chapter.exercises:
        add(nbformat.v4.new_markdown_cell(
            f"### `{exercise.name}` ({_worth(exercise)})\n\n"
            f"{exercise.summary[0].upper()}{exercise.summary[1:]}."), LESSON)
        add(nbformat.v4.new_code_cell(parts[exercise.name]), EXERCISE, exercise.name)
        if exercise.name in extra:
            add(nbformat.v4.new_code_cell(until_written(extra[exercise.name])), TRY, exercise.name)
    if "plot" in extra:
        add(nbformat.v4.new_markdown_cell("## Look at the weights\n\nDrawn from your own functions."),
            LESSON)
        add(nbformat.v4.new_code_cell(until_written(extra["plot"], plot=True)), PLOT)
    add(nbformat.v4.new_markdown_cell(
        "## Grade\n\nSave the notebook first: the grader reads the saved file, not this "
        "kernel's variables, and runs it in a separate process."), LESSON)
    add(nbformat.v4.new_code_cell(f'from grader import check\n\ncheck("{chapter.id}")'), GRADE)
    notebook = nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        METADATA_KEY: {"chapter": chapter.id, "edition": edition},
    })
    nbformat.validate(notebook)
    return nbformat.writes(notebook) + "\n"


def until_written(code: str, plot: bool = False) -> str:
    """A try or plot cell's ``code`` that says in a line when what it calls is
    not written yet, instead of raising; a plot cell (``plot``) says so too
    when a name it takes from a try cell above is missing.

    Run All (and ``nbconvert --execute``) stops at the first cell that
    raises, and a stub raises ``NotImplementedError`` until it is written:
    the grading cell at the end would never run, in every editor. The lines
    are indented under ``try:``, except those that continue a string
    (indenting them would change the string).
    """
    continued = _string_continuations(code)
    body = [line if not line.strip() or number in continued else "    " + line
            for number, line in enumerate(code.splitlines(), start=1)]
    lines = [
        "try:  # until an exercise is written, its stub raises NotImplementedError",
        *body,
        "except NotImplementedError:  # say so in a line, and let Run All go on to the grading cell",
        f'    print("{NOT_WRITTEN}")',
    ]
    if plot:  # a try cell above that stopped at a stub made none of what it names
        lines += ["except NameError as error:",
                  f'    print(f"{NOT_DRAWN}")']
    return "\n".join(lines)


def _string_continuations(code: str) -> set[int]:
    """The lines (from 1) that begin inside a string begun on an earlier line."""
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        lines.update(range(token.start[0] + 1, token.end[0] + 1))  # only strings span lines
    return lines


def _worth(exercise) -> str:
    """``3 points``; an optional exercise says it is worth none."""
    if exercise.optional:
        return "optional, no points"
    return f"{exercise.points} point{'s' * (exercise.points != 1)}"


def _how_to(chapter: Chapter) -> str:
    return (f"> **How to use this notebook.** The lesson comes first, then one code cell per "
            f"exercise: replace `raise NotImplementedError` with your code, run the cell and the "
            f"\"try it\" cell under it. The last cell grades the saved notebook, as "
            f"`mha-course grade {chapter.module}.ipynb` does. Try and plot cells are never "
            f"graded; your own extra cells are (keep them to definitions).")


def lesson_sections(readme: str, folder: Path, link: Callable[[Path], str]) -> list[str]:
    """The lesson split at its ``## `` headings (never inside a code block),
    each relative link replaced by ``link`` of the file it names (the lesson
    sits in ``folder``)."""
    sections, current, fenced = [], [], False
    for line in readme.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if line.startswith("## ") and not fenced and current:
            sections.append("\n".join(current).strip())
            current = []
        current.append(line)
    sections.append("\n".join(current).strip())

    def relink(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"[a-z]+:|#|/", target):
            return match.group(0)
        path, hash_, fragment = target.partition("#")
        # normpath, not resolve: the link names the file, not where a symlink leads
        return f"{match.group(1)}({link(Path(os.path.normpath(folder / path)))}{hash_}{fragment})"

    return [re.sub(r"(!?\[[^\]]*\])\(([^)\s]+)\)", relink, section) for section in sections if section]


def _relative_link(target: Path, start: Path) -> str:
    """``../chapters/01_self_attention/figures/x.svg``: ``target`` from ``start``."""
    return Path(os.path.relpath(target, start)).as_posix()


def split_code(code: str, exercises: list[str]) -> tuple[str, dict[str, str]]:
    """A chapter module cut into its setup (everything before the first
    exercise) and one part per exercise (its definition and what follows it
    up to the next exercise; comments just above a definition go with it)."""
    lines = code.splitlines()
    starts = {}
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in exercises:
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            while start > 0 and lines[start - 1].startswith("#"):
                start -= 1
            starts[node.name] = start
    missing = [name for name in exercises if name not in starts]
    if missing:
        raise ValueError(f"the chapter's code defines no {', '.join(missing)}")
    order = sorted(starts, key=starts.get)
    bounds = [starts[name] for name in order] + [len(lines)]
    parts = {name: "\n".join(lines[bounds[i]:bounds[i + 1]]).strip("\n") for i, name in enumerate(order)}
    return "\n".join(lines[: bounds[0]]).strip("\n"), parts


def extra_cells(path: Path) -> dict[str, str]:
    """``{exercise: try cell, "plot": plot cell}`` from a chapter's ``notebook.py``
    (cells start at ``# %% try NAME`` and ``# %% plot`` lines)."""
    if not path.exists():
        return {}
    cells: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        mark = CELL_MARK.match(line)
        if mark:
            current = cells.setdefault(mark.group(2) or "plot", [])
        elif current is not None:
            current.append(line)
    return {key: "\n".join(lines).strip("\n") for key, lines in cells.items()}


# -- reading ------------------------------------------------------------------


@dataclass(frozen=True)
class CellSpan:
    """Where one graded code cell sits in the code assembled from a notebook."""

    first_line: int  # its first line in the assembled code, from 1
    lines: int
    label: str  # how the student finds it: "code cell 7 (softmax)", "code cells 7+8 (softmax)"


@dataclass
class NotebookCode:
    """The Python a notebook submits, and how to talk about its lines.

    Attributes:
        source: the graded code cells, in order, one blank line apart.
        cells: where each of those cells sits in ``source``.
        notes: what was left out or joined, and why.
        exercise_cells: ``{exercise: names the cell tagged for it defines}``.
    """

    source: str
    cells: list[CellSpan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    exercise_cells: dict[str, list[str]] = field(default_factory=dict)

    def where(self, line: int) -> str:
        """``code cell 7 (softmax), line 3`` for a line of ``source``."""
        for cell in self.cells:
            if cell.first_line <= line < cell.first_line + cell.lines:
                return f"{cell.label}, line {line - cell.first_line + 1}"
        return f"line {line}"


@dataclass
class _Cell:
    """A graded code cell. Jupyter numbers no cells (its ``[7]`` counts runs),
    and a count that took in the lesson's markdown would match nothing on
    screen: a cell is named by
    its place among the code cells and by what the student sees in it, the
    exercise's name (the heading just above it) or its first line."""

    numbers: list[int]  # its place among the notebook's code cells; more than one when joined
    exercise: str | None
    opening: str  # its first line, shortened: "def largest(x, dim): ..."
    lines: list[str] = field(default_factory=list)

    @property
    def position(self) -> str:
        """``code cell 7``, or ``code cells 7+8`` for cells joined back."""
        return f"code cell{'s' * (len(self.numbers) > 1)} {'+'.join(map(str, self.numbers))}"

    @property
    def label(self) -> str:
        """``code cell 7 (softmax)``, ``code cell 3 (import numpy ...)``."""
        return f"{self.position} ({self.exercise or self.opening})"


def _opening(source: str, width: int = 40) -> str:
    """A cell's first line that is not blank, cut to ``width`` characters;
    `` ...`` says more follows."""
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    if not lines:
        return "empty"
    first = lines[0]
    if len(first) > width:
        return first[: width - 4].rstrip() + " ..."
    return first + " ..." * (len(lines) > 1)


MAGIC = re.compile(r"^\s*([%!]|\w+\s*=\s*[%!])|^\s*[\w.]+\?\??\s*$")
CELL_MAGICS_OF_PYTHON = ("%%time", "%%timeit", "%%capture")  # their body is still Python


def read_notebook(path: Path) -> NotebookCode:
    """The code a notebook submits; never runs any of it.

    Raises:
        NotebookError: the file is not a notebook the grader can read.
    """
    try:
        # utf-8-sig: a notebook passed through a Windows editor may start
        # with a byte-order mark, which JSON's parser refuses.
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise NotebookError(f"{path.name} is not UTF-8 text, so not a saved notebook") from None
    except OSError as error:
        raise NotebookError(f"cannot read {path.name}: {error.strerror}") from None
    if not text.strip():
        raise NotebookError(f"{path.name} is empty: save the notebook from Jupyter and try again")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise NotebookError(f"{path.name} is not valid notebook JSON (line {error.lineno}: "
                            f"{error.msg}); was it saved completely?") from None
    if not isinstance(raw, dict) or "cells" not in raw and "worksheets" not in raw:
        raise NotebookError(f"{path.name} is JSON but not a Jupyter notebook (no cells)")
    version = raw.get("nbformat")
    if not isinstance(version, int) or version not in (3, 4):
        raise NotebookError(f"{path.name} says it is notebook format {version!r}; the grader reads "
                            "format 4 (and 3): save it with a current Jupyter")
    import nbformat  # here: grading a .py file need not import it

    try:
        notebook = nbformat.reads(text, as_version=4)
    except Exception as error:  # nbformat's own errors vary between versions
        raise NotebookError(f"{path.name} could not be read as a notebook: "
                            f"{' '.join(str(error).split())[:200]}") from None
    return notebook_code(notebook)


def notebook_code(notebook: nbformat.NotebookNode) -> NotebookCode:
    """Assemble the graded cells of a parsed notebook into one module's code."""
    code = NotebookCode(source="")
    cells: list[_Cell] = []
    position = 0  # among the code cells: the lesson's markdown cells are not counted
    for cell in notebook.cells:
        if cell.get("cell_type") != "code":
            continue
        position += 1
        metadata = cell.get("metadata") or {}
        tags = set(metadata.get("tags") or ())
        if tags & NOT_GRADED:
            continue
        own = metadata.get(METADATA_KEY)
        exercise = own.get("exercise") if isinstance(own, dict) else None
        source = cell.get("source") or ""
        if isinstance(source, list):
            source = "".join(source)
        graded = _Cell([position], exercise if isinstance(exercise, str) else None, _opening(source))
        graded.lines, notes = _python_only(source, graded.label)
        code.notes.extend(notes)
        cells.append(graded)
        if EXERCISE in tags and isinstance(exercise, str):
            code.exercise_cells[exercise] = _defined_names("\n".join(graded.lines))
    lines: list[str] = []
    for cell in _join_split_cells(cells, code.notes):
        if lines:
            lines.append("")
        code.cells.append(CellSpan(len(lines) + 1, len(cell.lines), cell.label))
        lines.extend(cell.lines)
    code.source = "\n".join(lines) + "\n"
    return code


def _join_split_cells(cells: list[_Cell], notes: list[str], reach: int = 3) -> list[_Cell]:
    """Join a cell that does not parse with its neighbours when together they
    do: Jupyter's "split cell" cuts a function in two, and the first half (a
    signature and a docstring) may parse on its own while the second cannot."""
    joined: list[_Cell] = []
    index = 0
    while index < len(cells):
        cell = cells[index]
        if not _parses(cell.lines):
            # First with the cell before it (and maybe some after), then with
            # the cells after it alone.
            tries = [(True, index + k) for k in range(reach)]
            tries += [(False, index + k) for k in range(1, reach + 1)]
            for with_before, last in tries:
                parts = ([joined[-1]] if with_before and joined else []) + cells[index:last + 1]
                if last >= len(cells) or len(parts) < 2:
                    continue
                together = [line for part in parts for line in part.lines]
                if _parses(together):
                    if with_before:
                        joined.pop()
                    exercise = next((part.exercise for part in parts if part.exercise), None)
                    cell = _Cell([n for part in parts for n in part.numbers], exercise,
                                 parts[0].opening, together)
                    notes.append(f"{cell.position} were graded as one cell: apart "
                                 "they are not valid Python (a cell split inside a function?)")
                    index = last
                    break
        joined.append(cell)
        index += 1
    return joined


def _parses(lines: list[str]) -> bool:
    try:
        ast.parse("\n".join(lines))
    except (SyntaxError, ValueError):
        return False
    return True


def _python_only(source: str, label: str) -> tuple[list[str], list[str]]:
    """A cell's lines with IPython syntax blanked (line numbers kept), and
    notes that name the cell by ``label``."""
    lines = source.splitlines()
    first = lines[0].strip() if lines else ""
    if first.startswith("%%"):
        if first.split()[0] in CELL_MAGICS_OF_PYTHON:
            return ["", *lines[1:]], []
        return [""] * len(lines), [f"{label}: skipped, it is a {first.split()[0]} cell, "
                                   "not Python"]
    notes = []
    for index, line in enumerate(lines):
        if MAGIC.match(line) and not line.lstrip().startswith("#"):
            notes.append(f"{label}, line {index + 1}: skipped the IPython line "
                         f"{line.strip()[:60]!r}; the grader runs plain Python")
            lines[index] = ""
    return lines, notes


def _defined_names(source: str) -> list[str]:
    """The functions and classes a cell defines (none if it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
