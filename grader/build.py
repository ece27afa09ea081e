"""Generate everything students receive from the single source of truth.

``solutions/chNN_topic.py`` holds the reference code; the parts a student
writes sit between ``# BEGIN SOLUTION`` and ``# END SOLUTION``. The build
turns each solution file into the stub ``exercises/chNN_topic.py`` and runs
each chapter's ``figures.py`` to draw the lesson's figures. Nothing it writes
is edited by hand: ``mha-course build --check`` (and a test) fail when a
committed file differs from what the build writes now.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter
from grader.notebooks import notebook_text

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
    """Every file the build writes, with the text it writes."""
    files: dict[Path, str] = {}
    for chapter in CHAPTERS:
        solution = root / "solutions" / f"{chapter.module}.py"
        stub = stub_source(solution.read_text(encoding="utf-8"), str(solution.relative_to(root)))
        files[root / "exercises" / f"{chapter.module}.py"] = stub
        files[root / "exercises" / f"{chapter.module}.ipynb"] = notebook_text(chapter, stub, root)
        if figures:
            files.update(_chapter_figures(chapter, root))
    return files


def solution_notebooks(folder: Path, root: Path = COURSE_ROOT) -> dict[Path, str]:
    """The chapters' notebooks with the reference code filled in (for
    instructors), to be written into ``folder``."""
    files = {}
    for chapter in CHAPTERS:
        solution = (root / "solutions" / f"{chapter.module}.py").read_text(encoding="utf-8")
        files[folder / f"{chapter.module}.ipynb"] = notebook_text(chapter, solution, root, "solutions")
    return files


def stale_files(files: dict[Path, str]) -> list[Path]:
    """The files whose text on disk differs from what the build writes."""
    return [
        path
        for path, text in files.items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]


def write_files(files: dict[Path, str]) -> list[Path]:
    """Write the files that changed; return their paths."""
    changed = stale_files(files)
    for path in changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path], encoding="utf-8")
    return changed
