"""Turn a submitted file into code a worker can run, without running it here.

The grader's own process never executes student code: it only reads the file
and parses it. A notebook is first assembled into one module's code from its
graded cells (``grader.notebooks``); from then on it is graded like a file.

A syntax error should cost only the function it sits in, so a file that does
not parse is repaired: the top-level block holding the error (a ``def`` with
its decorators, or one statement) is blanked out, its name recorded as
broken, and the rest parsed again.

A submission is one file, as batch and Gradescope receive it: a module of
the student's own beside it that it imports (``attention_helpers.py``) is
not graded with it. One note at the top of the report says so, and a
statement that imports only such modules is not run (it would fail).
"""

from __future__ import annotations

import __future__ as future_flags
import ast
import importlib.metadata
import re
import sys
import tokenize
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path

from grader.catalog import CHAPTERS
from grader.name_resolution import walk
from grader.notebooks import NotebookCode, NotebookError, read_notebook

MAX_REPAIRS = 25  # a file with more broken blocks than this is not worth saving
DEFINITION = re.compile(r"(?:async\s+def|def|class)\s+(\w+)")


class SubmissionError(Exception):
    """The submission as a whole cannot be graded (unreadable, or no code left)."""


@dataclass(frozen=True)
class Problem:
    """Something wrong with the file itself, found before any code ran."""

    line: int
    message: str
    name: str | None = None  # the function or class it breaks, if any
    where: str = ""  # how the student finds the line: "line 12", "code cell 9 (softmax), line 3"

    def __str__(self) -> str:
        return f"{self.where or f'line {self.line}'}: {self.message}"


@dataclass
class Submission:
    """A parsed submission, ready to be run statement by statement in a worker.

    Attributes:
        path: the file as given.
        module_name: the name the code is run under (the chapter's module).
        source: the text of the file.
        statements: ``(first line, compiled code, syntax tree)`` of each
            top-level statement, in order; a worker runs them one at a time
            so that one failing statement does not stop the rest.
        broken: names whose definition had a syntax error, with the problem.
        problems: every syntax problem found, broken names included.
        notebook: for a notebook, where its cells sit in ``source``.
        notes: on the file as a whole, for the top of its report: a module
            of the student's own it imports, what a notebook's reading left
            out or joined.
    """

    path: Path
    module_name: str
    source: str
    statements: list[tuple[int, object, ast.stmt]] = field(default_factory=list)
    broken: dict[str, Problem] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    notebook: NotebookCode | None = None
    notes: list[str] = field(default_factory=list)

    def where(self, line: int) -> str:
        """How a student finds a line of ``source``: ``line 12`` in a file,
        ``cell 9 (softmax), line 3`` in a notebook."""
        return self.notebook.where(line) if self.notebook else f"line {line}"


def _is_block_start(line: str) -> bool:
    """A line at column 0 that begins a new top-level statement."""
    return bool(line) and not line[0].isspace() and line[0] not in "#)]}"


def _top_level_block(lines: list[str], line_number: int) -> tuple[int, int]:
    """The ``[start, end)`` line indices of the top-level block holding a line."""
    index = min(max(line_number - 1, 0), len(lines) - 1)
    start = index
    while start > 0 and not _is_block_start(lines[start]):
        start -= 1
    while start > 0 and lines[start - 1].startswith("@"):  # keep decorators with their def
        start -= 1
    end = index + 1
    while end < len(lines) and not _is_block_start(lines[end]):
        end += 1
    return start, end


def _block_name(lines: list[str], start: int, end: int) -> str | None:
    for line in lines[start:end]:
        match = DEFINITION.match(line)
        if match:
            return match.group(1)
        if not line.startswith("@"):
            return None
    return None


def parse_with_repairs(source: str, filename: str) -> tuple[ast.Module, list[Problem]]:
    """Parse ``source``, blanking out each top-level block with a syntax error.

    Blanked lines stay as empty lines, so every line number the student sees
    in a message is the line number in their file.
    """
    lines = source.splitlines(keepends=True)
    problems: list[Problem] = []
    for _ in range(MAX_REPAIRS):
        try:
            return ast.parse("".join(lines), filename), problems
        except SyntaxError as error:
            if not lines:
                raise SubmissionError(f"syntax error: {error.msg}") from None
            start, end = _top_level_block(lines, error.lineno or 1)
            name = _block_name(lines, start, end)
            detail = f"syntax error: {error.msg}"
            if name:
                detail += f" (in {name}, which cannot be graded until it parses)"
            problems.append(Problem(error.lineno or start + 1, detail, name))
            lines[start:end] = ["\n"] * (end - start)
    raise SubmissionError(f"more than {MAX_REPAIRS} syntax errors; first: {problems[0]}")


def _future_flags(tree: ast.Module) -> int:
    """Compiler flags for ``from __future__ import ...`` lines, which must
    apply to every statement compiled on its own."""
    flags = 0
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                feature = getattr(future_flags, alias.name, None)
                flags |= getattr(feature, "compiler_flag", 0)
    return flags


def _compile(source: str, filename: str) -> tuple[ast.Module, list[Problem], list]:
    """Parse ``source`` (repairing syntax errors) and compile each top-level
    statement on its own: the tree, the problems found, the statements."""
    tree, problems = parse_with_repairs(source, filename)
    flags = _future_flags(tree)
    statements = []
    for node in tree.body:
        try:
            code = compile(ast.Module(body=[node], type_ignores=[]), filename, "exec", flags=flags)
        except SyntaxError as error:  # parses, but does not compile: `return` outside a def
            name = getattr(node, "name", None)
            problems.append(Problem(error.lineno or node.lineno, f"syntax error: {error.msg}", name))
            continue
        statements.append((node.lineno, code, node))
    return tree, problems, statements


def read_python(path: Path) -> str:
    """A ``.py`` file's text as Python reads it: a UTF-8 byte-order mark
    (some Windows editors write one) or a coding line names the encoding,
    and neither is left in the text.

    Raises:
        SubmissionError: the file cannot be read or decoded.
    """
    try:
        with tokenize.open(path) as file:
            return file.read()
    except (UnicodeDecodeError, SyntaxError):  # SyntaxError: a coding line Python cannot use
        raise SubmissionError(f"{path.name} is not UTF-8 text") from None
    except OSError as error:
        raise SubmissionError(f"cannot read {path.name}: {error.strerror}") from None


def load_submission(path: Path, module_name: str) -> Submission:
    """Read and parse a ``.py`` or ``.ipynb`` submission; never runs any of its code.

    Raises:
        SubmissionError: the file cannot be read or decoded.
    """
    notebook = None
    if path.suffix == ".ipynb":
        try:
            notebook = read_notebook(path)
        except NotebookError as error:
            raise SubmissionError(str(error)) from None
        source = notebook.source
        if not source.strip():
            raise SubmissionError(f"{path.name} has no code cells to grade")
    else:
        source = read_python(path)
    if "\0" in source:
        raise SubmissionError(f"{path.name} contains null bytes: is it really a Python file?")
    try:
        tree, problems, statements = _compile(source, str(path))
    except (RecursionError, MemoryError, ValueError, OverflowError) as error:
        # Python's own parser and compiler give up on some files: an
        # expression nested thousands deep, one too large for memory.
        why = "nested too deeply" if isinstance(error, RecursionError) else "too large"
        if isinstance(error, (ValueError, OverflowError)):
            why = f"not valid Python ({error})"
        raise SubmissionError(f"{path.name} cannot be parsed: it is {why}") from None
    submission = Submission(path=path, module_name=module_name, source=source,
                            statements=statements, notebook=notebook)
    # Each problem is placed once, here: a line of a notebook's assembled
    # code is a line no cell has, so every message (the worker's too) says
    # where the student finds it.
    submission.problems = [replace(p, where=submission.where(p.line)) for p in problems]
    submission.broken = {problem.name: problem for problem in submission.problems if problem.name}
    local = _local_modules(tree, path.parent, module_name)
    if local:
        # A statement that imports only those would fail in the worker: the
        # note at the top says why, once, instead of a failed import.
        submission.statements = [statement for statement in statements
                                 if not _imports_only(statement[2], local.keys())]
    submission.notes = _local_module_note(submission, local) + (notebook.notes if notebook else [])
    return submission


def _imported(node: ast.AST) -> list[str]:
    """The top-level modules an import statement names (none for a relative
    import, which fails in Python itself: the file is no package)."""
    if isinstance(node, ast.Import):
        return [alias.name.partition(".")[0] for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module.partition(".")[0]]
    return []


def _imports_only(node: ast.AST, modules: Collection[str]) -> bool:
    """Is ``node`` an import statement of ``modules`` and nothing else?"""
    names = _imported(node)
    return bool(names) and set(names) <= set(modules)


def _local_modules(tree: ast.Module, folder: Path, module_name: str) -> dict[str, int]:
    """The student's own modules beside the file that its code imports
    (``attention_helpers.py``, or a package folder), with the first line of
    each import: none a worker can import. The course's chapter files are not
    among them (a worker may import those, ``sandbox``), nor what is
    installed. Imports where the grader never runs (``if __name__ ==
    "__main__":``) are not read."""
    chapters = {chapter.module for chapter in CHAPTERS} | {module_name}
    if not _modules_beside(folder) - chapters:  # nothing there to import: no need to read every node
        return {}
    found: dict[str, int] = {}
    for node in walk(tree):
        for name in _imported(node):
            if name not in chapters and _beside(folder, name) and not _installed(name):
                found[name] = min(found.get(name, node.lineno), node.lineno)
    return dict(sorted(found.items(), key=lambda item: item[1]))


def _modules_beside(folder: Path) -> set[str]:
    """The names of the modules ``folder`` holds (``name.py``, a folder with
    an ``__init__.py``), as ``_beside`` finds them."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return set()
    return {entry.stem for entry in entries if entry.suffix == ".py" and entry.is_file()} | \
        {entry.name for entry in entries if (entry / "__init__.py").is_file()}


def _installed(name: str) -> bool:
    """Can a worker import ``name`` from this Python (a standard module, an
    installed one, one the grader imported)?"""
    return (name in sys.stdlib_module_names or name in sys.modules
            or name in importlib.metadata.packages_distributions())


def _beside(folder: Path, name: str) -> str | None:
    """``name.py`` or ``name/``, when ``folder`` holds that module; else None."""
    if (folder / f"{name}.py").is_file():
        return f"{name}.py"
    if (folder / name / "__init__.py").is_file():
        return f"{name}/"
    return None


def _local_module_note(submission: Submission, local: dict[str, int]) -> list[str]:
    """One note, when the file imports modules of the student's own
    (``local``, by name, with the line of their first import): a submission
    is one file (what batch and Gradescope receive), so they are not graded
    with it, and what they would define is missing."""
    if not local:
        return []
    own = submission.path.name
    modules = " and ".join(_beside(submission.path.parent, name) for name in local)
    lines = " and ".join(submission.where(line) for line in local.values())
    return [f"only {own} is graded, not {modules} beside it, which it imports at {lines}: a submission "
            f"is one file, as batch and Gradescope receive it; copy what you use of it into {own}"]
