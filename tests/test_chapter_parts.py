"""Every chapter of the catalog has every part the recipe names.

grader/README.md's "Adding a chapter" lists the files a chapter needs, one
numbered step each. Here each part is one test a chapter, which fails with
the part, its path and the step that adds it, so that a new chapter learns
what it lacks from one run of this file. What a part must hold is the
business of the test named in that step (test_lessons.py, test_course.py,
test_known_bugs.py, ...); this file only finds what is missing, and grades
nothing.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from mistakes import MIN_MISTAKES

from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter, Exercise
from grader.known_bugs import KNOWN_BUGS
from grader.scaffold import SLUG
from grader.verify import MIN_BUGS

RECIPE = COURSE_ROOT / "grader" / "README.md"
SNAPSHOT = COURSE_ROOT / "tests" / "snapshots" / "grades.json"


@dataclass(frozen=True)
class Part:
    """One part of a chapter: ``missing(chapter, root)`` says what it lacks
    (None when nothing), ``where(chapter)`` the path to look at; ``step`` and
    ``title`` are the recipe's step that adds it."""

    name: str
    step: int
    title: str
    where: Callable[[Chapter], str]
    missing: Callable[[Chapter, Path], str | None]


def _exists(*paths: Callable[[Chapter, Path], Path]) -> Callable[[Chapter, Path], str | None]:
    """A part that is files: what it lacks is the files that do not exist."""

    def missing(chapter: Chapter, root: Path) -> str | None:
        absent = [path(chapter, root) for path in paths if not path(chapter, root).is_file()]
        return f"no {', '.join(str(path.relative_to(root)) for path in absent)}" if absent else None

    return missing


def _catalog(chapter: Chapter, root: Path) -> str | None:
    others = [other for other in CHAPTERS if other is not chapter]
    names = [exercise.name for exercise in chapter.exercises]
    if not 1 <= chapter.number <= 99 or chapter.number in {other.number for other in others}:
        return f"number {chapter.number} is not one of 1 to 99 that no other chapter has"
    if not SLUG.fullmatch(chapter.slug) or chapter.slug in {other.slug for other in others}:
        return f"slug {chapter.slug!r} is not lowercase words joined by _, or another chapter's"
    if not names or len(set(names)) != len(names) or not all(name.isidentifier() for name in names):
        return f"exercises {names} are not one or more Python names, each once"
    return None


def _definitions(source: str) -> dict[str, ast.AST]:
    return {node.name: node for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def _solution(chapter: Chapter, root: Path) -> str | None:
    path = chapter.solution(root)
    if not path.is_file():
        return "no such file"
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    defined = _definitions(source)
    starts = sorted(node.lineno for node in ast.parse(source).body)
    for exercise in chapter.exercises:
        if exercise.name not in defined:
            return f"defines no {exercise.name} at its top level"
        node = defined[exercise.name]
        # Up to the next top-level statement: a comment that ends a body is no part of its node.
        end = next((start - 1 for start in starts if start > node.end_lineno), len(lines))
        body = [line.strip() for line in lines[node.lineno - 1:end]]
        if "# BEGIN SOLUTION" not in body or "# END SOLUTION" not in body:
            return f"{exercise.name} has no # BEGIN SOLUTION / # END SOLUTION lines around what the student writes"
    return None


def _known_bugs(chapter: Chapter, root: Path) -> str | None:
    if not chapter.bugs(root).is_file():
        return "no such file"
    bugs = KNOWN_BUGS.get(chapter.id, ())
    few = [f"{exercise.name} ({sum(bug.exercise == exercise.name for bug in bugs)})"
           for exercise in chapter.exercises if sum(bug.exercise == exercise.name for bug in bugs) < MIN_BUGS]
    return f"fewer than {MIN_BUGS} known bugs for {', '.join(few)}" if few else None


def _lesson(chapter: Chapter, root: Path) -> str | None:
    path = chapter.lesson(root)
    if not path.is_file():
        return "no such file"
    text = path.read_text(encoding="utf-8")
    wanted = {
        "a figure shown as ![...](figures/name.svg)": r"!\[[^\]]*\]\(figures/",
        'a "## N. Pitfalls" section': r"^## \d+\. Pitfalls$",
        "a <!-- known bugs: ... --> tag": r"<!--\s*known bugs:",
        "table of exercises": r"^\| Exercise \| Points \|",
        f"the line mha-course grade {chapter.id}": rf"mha-course grade {chapter.id}\b",
    }
    lacking = [what for what, pattern in wanted.items() if not re.search(pattern, text, flags=re.MULTILINE)]
    return f"has no {', no '.join(lacking)}" if lacking else None


def _figures(chapter: Chapter, root: Path) -> str | None:
    path = root / "chapters" / chapter.folder / "figures.py"
    if not path.is_file():
        return "no such file"
    return None if "figures" in _definitions(path.read_text(encoding="utf-8")) else "defines no figures()"


def _chapter_tests(chapter: Chapter, root: Path) -> str | None:
    """Read, not imported: the names it defines at its top level."""
    path = root / "tests" / f"test_{chapter.module}.py"
    if not path.is_file():
        return "no such file"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    defined |= {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(target, ast.Name)}
    lacking = [name for name in ("samples", "RELEASE_BUG") if name not in defined]
    return f"defines no {' and no '.join(lacking)}" if lacking else None


def _correct_styles(chapter: Chapter, root: Path) -> str | None:
    found = sorted((root / "tests" / "correct_styles").glob(f"{chapter.id}_*.py"))
    return None if len(found) >= 3 else f"holds {len(found)} {chapter.id}_<style>.py, three at least are needed"


def _mistakes(chapter: Chapter, root: Path) -> str | None:
    """Read, not imported: each exercise's ``Mistake``s in ``MISTAKES`` (the
    corpus's rules, tests/test_mistakes.py, hold the rest)."""
    path = root / "tests" / "mistakes" / f"{chapter.id}.py"
    if not path.is_file():
        return "no such file"
    calls = [node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Mistake" and node.args
             and isinstance(node.args[0], ast.Constant)]
    counts = {exercise.name: sum(call.args[0].value == exercise.name for call in calls)
              for exercise in chapter.exercises}
    few = [f"{name} ({count})" for name, count in counts.items() if count < MIN_MISTAKES]
    return f"fewer than {MIN_MISTAKES} mistakes for {', '.join(few)}" if few else None


def _readme_row(chapter: Chapter, root: Path) -> str | None:
    text = (root / "README.md").read_text(encoding="utf-8")
    table = text[text.find("## Chapters"):]
    return None if f"](chapters/{chapter.folder}/README.md)" in table else (
        f'has no row linking chapters/{chapter.folder}/README.md in its "## Chapters" table')


@functools.cache
def _snapshot() -> dict:
    return json.loads(SNAPSHOT.read_text(encoding="utf-8")) if SNAPSHOT.is_file() else {}


def _snapshot_entry(chapter: Chapter, root: Path) -> str | None:
    lacking = [f"{edition} {exercise.name}" for edition in ("solutions", "stubs") for exercise in chapter.exercises
               if not any((entry["chapter"], entry["exercise"]) == (chapter.id, exercise.name)
                          for entry in _snapshot().get(edition, {}).get("exercises", []))]
    return f"has no grade of {', '.join(lacking)}" if lacking else None


def _grading(name: str) -> Callable[[Chapter, Path], Path]:
    return lambda chapter, root: chapter.grading(root) / name


PARTS = [
    Part("catalog", 1, "Catalog entry", lambda chapter: "grader/catalog.py", _catalog),
    Part("solution", 2, "Reference solution", lambda chapter: f"solutions/{chapter.file_name}", _solution),
    Part("oracles", 3, "Oracles", lambda chapter: f"grader/chapters/{chapter.id}/",
         _exists(_grading("__init__.py"), lambda chapter, root: chapter.oracles(root))),
    Part("checks", 4, "Checks", lambda chapter: f"grader/chapters/{chapter.id}/{chapter.checks.name}",
         _exists(lambda chapter, root: chapter.grading(root) / chapter.checks.name)),
    Part("known-bugs", 5, "Known bugs", lambda chapter: f"grader/chapters/{chapter.id}/bugs.py", _known_bugs),
    Part("lesson", 6, "Lesson", lambda chapter: f"chapters/{chapter.folder}/README.md", _lesson),
    Part("figures", 7, "Figures", lambda chapter: f"chapters/{chapter.folder}/figures.py", _figures),
    Part("notebook-cells", 8, "Notebook cells", lambda chapter: f"chapters/{chapter.folder}/notebook.py",
         _exists(lambda chapter, root: root / "chapters" / chapter.folder / "notebook.py")),
    Part("chapter-tests", 9, "The chapter's tests", lambda chapter: f"tests/test_{chapter.module}.py",
         _chapter_tests),
    Part("correct-styles", 10, "Correct styles", lambda chapter: f"tests/correct_styles/{chapter.id}_<style>.py",
         _correct_styles),
    Part("mistakes", 11, "Uncatalogued mistakes", lambda chapter: f"tests/mistakes/{chapter.id}.py", _mistakes),
    Part("readme-row", 12, "README row", lambda chapter: "README.md", _readme_row),
    Part("built", 13, "Build", lambda chapter: f"exercises/{chapter.module}.py and .ipynb",
         _exists(lambda chapter, root: chapter.stub(root), lambda chapter, root: chapter.notebook(root))),
    Part("snapshot", 14, "Snapshot", lambda chapter: "tests/snapshots/grades.json", _snapshot_entry),
]


def lacks(chapter: Chapter, part: Part, root: Path = COURSE_ROOT) -> str | None:
    """The failure message for ``part`` of ``chapter``: None when it is there."""
    missing = part.missing(chapter, root)
    if missing is None:
        return None
    return (f"{chapter.id}'s {part.title.lower()} ({part.where(chapter)}): {missing}. It is step {part.step}, "
            f"\"{part.title}\", of the recipe in grader/README.md, \"Adding a chapter\"")


CASES = [(chapter, part) for chapter in CHAPTERS for part in PARTS]


@pytest.mark.parametrize("chapter, part", CASES, ids=[f"{chapter.id}-{part.name}" for chapter, part in CASES])
def test_the_chapter_has_the_part(chapter, part):
    message = lacks(chapter, part)
    assert message is None, message


def _recipe_steps() -> dict[int, str]:
    """``{number: title}`` of the numbered steps of grader/README.md's "Adding a chapter"."""
    text = RECIPE.read_text(encoding="utf-8")
    section = text[text.index("## Adding a chapter"):]
    return {int(number): title for number, title in re.findall(r"^(\d+)\. \*\*(.+?)\*\*", section, flags=re.MULTILINE)}


def test_each_part_names_a_step_of_the_recipe_by_its_number_and_title():
    steps = _recipe_steps()
    assert {part.step: part.title for part in PARTS} == {step: title for step, title in steps.items()
                                                         if step in {part.step for part in PARTS}}
    # Every step but the last, the proof, adds a part that a test here looks for.
    assert set(steps) - {part.step for part in PARTS} == {max(steps)}


def test_a_chapter_with_no_files_lacks_every_part_but_its_entry():
    """Not vacuous: a chapter the catalog does not hold, whose files no one
    wrote, fails every part but its catalog entry, each message naming the
    part's path and its step."""
    nowhere = Chapter(number=99, slug="nowhere", title="Nowhere", exercises=(Exercise("nothing", "x", 1),))
    for part in PARTS:
        message = lacks(nowhere, part)
        if part.name == "catalog":
            assert message is None
            continue
        assert message is not None, part.name
        assert part.where(nowhere) in message and f"step {part.step}, \"{part.title}\"" in message, message
