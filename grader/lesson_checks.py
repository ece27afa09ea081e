"""What each lesson says its checks try, written from the checks themselves.

A lesson's section on grading holds, between two marker lines, one list per
exercise of the sentences its checks report, each check's docstring (its
first line, as ``check_runner.check_title`` shows it):

    <!-- checks: begin -->
    (written by ``mha-course build``)
    <!-- checks: end -->

The build (``grader/build.py``) writes the list; everything outside the
markers is the author's, kept as it is. The checks are read with ``ast``,
never imported: reading a lesson runs no check. A parametrized check is one
sentence, however many cases it runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

from grader.catalog import COURSE_ROOT, Chapter

BEGIN = "<!-- checks: begin -->"
END = "<!-- checks: end -->"
# Inside the list, for whoever edits the lesson's raw text; it names no
# command: the student edition ships the lesson, and no instructor's command.
NOTICE = ("<!-- The build writes this list from the checks' docstrings: "
          "change a check, then build; never edit the list. -->")
RECIPE = "see grader/README.md, Adding a chapter"
# The factory in grader/checks.py that makes a chapter's GPU-portability
# check, and the function that makes each of its cases: ``test_x =
# portability_check([portable("name", ...), ...])``.
PORTABILITY_FACTORY, PORTABLE_CASE = "portability_check", "portable"


class LessonError(ValueError):
    """A lesson or a checks file the build cannot read; the message is one line."""


def checks_path(chapter: Chapter, root: Path = COURSE_ROOT) -> Path:
    """The chapter's checks under ``root``: ``grader/chapters/ch01/test_ch01_self_attention.py``."""
    return chapter.grading(root) / chapter.checks.name


def check_titles(chapter: Chapter, root: Path = COURSE_ROOT) -> dict[str, list[str]]:
    """``{exercise: [sentence, ...]}``: what each exercise's checks try, in
    the catalog's order of exercises and the file's order of checks."""
    path = checks_path(chapter, root)
    shown = path.relative_to(root).as_posix()
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), shown)
    except (OSError, SyntaxError) as error:
        raise LessonError(f"cannot read {chapter.id}'s checks, {shown}: {error}") from None
    titles: dict[str, list[str]] = {exercise.name: [] for exercise in chapter.exercises}
    for node in tree.body:
        for name, title in _checks_of(node, shown, root):
            if name not in titles:
                raise LessonError(f"{shown}:{node.lineno}: a check of {name!r}, which {chapter.id} has no exercise of")
            titles[name].append(title)
    return titles


def _checks_of(node: ast.stmt, shown: str, root: Path) -> list[tuple[str, str]]:
    """The ``(exercise, sentence)`` pairs a top-level statement of a checks
    file defines: none, one (a ``def test_...``), or one an exercise (the
    portability check)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
        names = [_literal(decorator.args[0]) for decorator in node.decorator_list
                 if isinstance(decorator, ast.Call) and _called(decorator) == "exercise" and decorator.args]
        if len(names) != 1 or names[0] is None:
            raise LessonError(f"{shown}:{node.lineno}: {node.name} needs one @exercise(\"name\")")
        return [(names[0], _title(node, shown))]
    if isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) and target.id.startswith("test")
                                            for target in node.targets):
        if not (isinstance(node.value, ast.Call) and _called(node.value) == PORTABILITY_FACTORY):
            raise LessonError(f"{shown}:{node.lineno}: a check made by {ast.unparse(node.value)[:40]}, "
                              f"which the lesson's list cannot read; define it with def")
        title = _portability_title(root)
        return [(_literal(case.args[0]), title) for case in ast.walk(node.value)
                if isinstance(case, ast.Call) and _called(case) == PORTABLE_CASE and case.args]
    return []


def _called(call: ast.Call) -> str:
    """The name a call calls: ``exercise`` of ``exercise(...)`` and of ``checks.exercise(...)``."""
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _title(function: ast.FunctionDef | ast.AsyncFunctionDef, shown: str) -> str:
    """The docstring's first line without its full stop: what a report shows."""
    docstring = ast.get_docstring(function)
    if not docstring:
        raise LessonError(f"{shown}:{function.lineno}: {function.name} has no docstring, "
                          "the sentence a student reads")
    return docstring.splitlines()[0].strip().rstrip(".")


def _portability_title(root: Path) -> str:
    """The docstring of the check that ``portability_check`` in
    ``grader/checks.py`` makes."""
    path = root / "grader" / "checks.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == PORTABILITY_FACTORY:
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef):
                    return _title(inner, "grader/checks.py")
    raise LessonError(f"grader/checks.py has no {PORTABILITY_FACTORY} defining a check")


def checks_block(titles: dict[str, list[str]]) -> str:
    """The lines between the markers: a folded list for each exercise, in
    HTML, so that no sentence is read as Markdown (``h*d to (h+1)*d``)."""
    blocks = [NOTICE]
    for name, sentences in titles.items():
        items = [f"<li>{_escaped(sentence)}</li>" for sentence in sentences] or [
            "<li>no check yet</li>"]
        blocks.append("\n".join([f"<details>\n<summary><code>{name}</code></summary>", "<ul>", *items, "</ul>",
                                 "</details>"]))
    return "\n\n".join(blocks)


def _escaped(sentence: str) -> str:
    """``sentence`` as HTML text: only ``&`` and ``<`` need escaping there,
    and ``>=`` reads better raw than ``&gt;=``."""
    return sentence.replace("&", "&amp;").replace("<", "&lt;")


def lesson_text(chapter: Chapter, root: Path = COURSE_ROOT) -> str:
    """The lesson as the build writes it: the text on disk, with what lies
    between its markers replaced by ``checks_block`` of its checks."""
    path = chapter.lesson(root)
    return with_checks(path.read_text(encoding="utf-8"), checks_block(check_titles(chapter, root)),
                       path.relative_to(root).as_posix())


def with_checks(lesson: str, block: str, shown: str = "the lesson") -> str:
    """``lesson`` with ``block`` between its markers, each alone on its line,
    once, ``BEGIN`` first; anything else is refused (``LessonError``)."""
    lines = lesson.splitlines(keepends=True)
    begins = [number for number, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [number for number, line in enumerate(lines) if line.strip() == END]
    if len(begins) != 1 or len(ends) != 1:
        raise LessonError(f"{shown}: needs one line {BEGIN} and, below it, one line {END} where the "
                          f"list of checks goes (found {len(begins)} and {len(ends)}); {RECIPE}")
    if begins[0] > ends[0]:
        raise LessonError(f"{shown}: its line {END} comes before its line {BEGIN}; {RECIPE}")
    return "".join(lines[:begins[0] + 1]) + block + "\n" + "".join(lines[ends[0]:])
