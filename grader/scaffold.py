"""``mha-course new-chapter NN slug TITLE``: the skeleton of a new chapter.

It writes a first draft of every file of grader/README.md's recipe
("Adding a chapter") that can be written before the chapter's content
exists, each with ``TODO`` where the author's words and code go, and one
exercise (``example`` unless ``--exercise`` names them) worked through all
of them, so that the skeleton builds, grades and verifies from the start.
It adds the chapter's entry at the end of ``catalog.py``'s ``CHAPTERS`` and
its row to README.md's chapter table, and writes no other file that exists:
what it cannot write (the correct styles, the snapshot, the built stub and
notebook) ``mha-course verify`` and ``tests/test_chapter_parts.py`` name.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
from dataclasses import dataclass
from pathlib import Path

from grader.catalog import CHAPTERS, Chapter, Exercise

# A slug names the chapter's files (``ch13_sliding_window.py``): lowercase
# words joined by single underscores, starting with a letter.
SLUG = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
EXAMPLE = "example"  # the exercise's name when the author names none yet


class ScaffoldError(ValueError):
    """Why the skeleton cannot be written, in one line; nothing was written."""


@dataclass(frozen=True)
class Skeleton:
    """What ``new-chapter`` writes: ``created`` are new files, ``edited`` the
    new text of files that exist (catalog.py, README.md); paths are absolute."""

    chapter: Chapter
    created: dict[Path, str]
    edited: dict[Path, str]


def plan(root: Path, number: int, slug: str, title: str, exercises: tuple[str, ...] = (EXAMPLE,)) -> Skeleton:
    """The skeleton of chapter ``number`` in the course at ``root``, checked
    against the course as it is (``CHAPTERS``). Writes nothing.

    Raises:
        ScaffoldError: the number or slug is taken or malformed, an exercise
            name is not a Python name, or a file it would create exists.
    """
    _check_names(number, slug, title, exercises)
    chapter = Chapter(number=number, slug=slug, title=title.strip(),
                      exercises=tuple(Exercise(name, "TODO: a few words for tables", 1) for name in exercises))
    created = _files(chapter, root)
    existing = sorted(str(path.relative_to(root)) for path in created if path.exists())
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise ScaffoldError(f"{existing[0]}{more} exists already: new-chapter writes only new files, "
                            "so move it away or add the chapter by hand (grader/README.md, \"Adding a chapter\")")
    catalog = root / "grader" / "catalog.py"
    readme = root / "README.md"
    edited = {catalog: with_catalog_entry(catalog.read_text(encoding="utf-8"), catalog_entry(chapter)),
              readme: with_chapter_row(readme.read_text(encoding="utf-8"), chapter)}
    return Skeleton(chapter, created, edited)


def write(skeleton: Skeleton) -> list[Path]:
    """Write the skeleton; returns the paths written, the new files first."""
    for path, text in skeleton.created.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("x", encoding="utf-8") as file:  # "x": never over a file made meanwhile
            file.write(text)
    for path, text in skeleton.edited.items():
        path.write_text(text, encoding="utf-8")
    return [*skeleton.created, *skeleton.edited]


def _check_names(number: int, slug: str, title: str, exercises: tuple[str, ...]) -> None:
    if not 1 <= number <= 99:
        raise ScaffoldError(f"chapter number {number} is not between 1 and 99 (its id is chNN, two digits)")
    if not SLUG.fullmatch(slug):
        raise ScaffoldError(f"slug {slug!r} is not lowercase words joined by single underscores, "
                            "such as sliding_window")
    if re.fullmatch(r"ch\d+(_.*)?|\d.*", slug):
        raise ScaffoldError(f"slug {slug!r} would read as a chapter number on the command line")
    for chapter in CHAPTERS:
        if chapter.number == number:
            raise ScaffoldError(f"chapter {number} exists already: {chapter.id}, {chapter.slug}")
        if chapter.slug == slug:
            raise ScaffoldError(f"slug {slug!r} is chapter {chapter.number}'s already")
    if not title.strip() or "\n" in title:
        raise ScaffoldError("the title is one line of words, such as \"Sliding-window attention\"")
    if not exercises:
        raise ScaffoldError("a chapter has at least one exercise")
    for name in exercises:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ScaffoldError(f"exercise {name!r} is not a Python name: it is the function the student writes")
    if len(set(exercises)) != len(exercises):
        raise ScaffoldError("an exercise is named twice")


# -- the two files it edits ------------------------------------------------------------------


def catalog_entry(chapter: Chapter) -> str:
    """The chapter's ``Chapter(...)`` in ``CHAPTERS``, indented as an item of it."""
    exercises = "".join(f"            Exercise({_quoted(exercise.name)}, {_quoted(exercise.summary)}, "
                        f"{exercise.points}),\n" for exercise in chapter.exercises)
    return (f"    Chapter(\n"
            f"        number={chapter.number},\n"
            f"        slug={_quoted(chapter.slug)},\n"
            f"        title={_quoted(chapter.title)},\n"
            f"        # TODO: what the chapter forbids (Exercise.forbidden) and why, if anything.\n"
            f"        exercises=(\n{exercises}"
            f"        ),\n"
            f"    ),\n")


def _quoted(text: str) -> str:
    """``text`` as a Python string in double quotes, as catalog.py writes them."""
    return json.dumps(text, ensure_ascii=False)


def with_catalog_entry(catalog: str, entry: str) -> str:
    """``catalog`` (grader/catalog.py's text) with ``entry`` added as the last
    item of ``CHAPTERS``, before its closing parenthesis; nothing else changes.

    Raises:
        ScaffoldError: CHAPTERS is not a tuple whose ``)`` has a line of its own.
    """
    tree = ast.parse(catalog)
    found = [node.value for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             and any(isinstance(target, ast.Name) and target.id == "CHAPTERS"
                     for target in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
    lines = catalog.splitlines(keepends=True)
    if len(found) != 1 or not isinstance(found[0], ast.Tuple) or not found[0].elts:
        raise ScaffoldError("grader/catalog.py has no CHAPTERS = (...) tuple to add the chapter to")
    chapters = found[0]
    closing = chapters.end_lineno - 1  # the line of CHAPTERS' ")", counted from 0
    last = chapters.elts[-1]
    between = "".join(lines[last.end_lineno - 1:closing + 1])[last.end_col_offset:]
    if lines[closing].strip() != ")" or "," not in between:
        raise ScaffoldError("grader/catalog.py's CHAPTERS does not end with \"),\" and a line \")\": "
                            "add the entry by hand (grader/README.md, \"Adding a chapter\")")
    return "".join(lines[:closing]) + entry + "".join(lines[closing:])


def with_chapter_row(readme: str, chapter: Chapter) -> str:
    """``readme`` (README.md's text) with the chapter's row added under the
    last row of its "## Chapters" table.

    Raises:
        ScaffoldError: README.md has no such table.
    """
    lines = readme.splitlines(keepends=True)
    try:
        start = lines.index("## Chapters\n")
    except ValueError:
        raise ScaffoldError("README.md has no \"## Chapters\" section with its table") from None
    rows = [index for index in range(start, len(lines)) if lines[index].startswith("| [")]
    if not rows:
        raise ScaffoldError("README.md's \"## Chapters\" section has no table of chapters")
    end = rows[0]
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    row = (f"| [{chapter.number:02d}](chapters/{chapter.folder}/README.md) | {chapter.title[0].lower()}"
           f"{chapter.title[1:]} | TODO: its exercises, in a few words |\n")
    return "".join(lines[:end]) + row + "".join(lines[end:])


# -- the files it creates ---------------------------------------------------------------------


def _files(chapter: Chapter, root: Path) -> dict[Path, str]:
    """``{path: text}`` of every file the skeleton creates, in the recipe's order."""
    lesson = root / "chapters" / chapter.folder
    grading = chapter.grading(root)
    return {
        chapter.solution(root): _solution(chapter),
        grading / "__init__.py": f'"""Chapter {chapter.number}\'s grading: its checks, known bugs and oracles '
                                 '(``grader.chapters``)."""\n',
        grading / f"test_{chapter.module}.py": _checks(chapter),
        chapter.bugs(root): _bugs(chapter),
        chapter.oracles(root): _oracles(chapter),
        lesson / "README.md": _lesson(chapter),
        lesson / "figures.py": _figures(chapter),
        lesson / "notebook.py": _notebook(chapter),
        root / "tests" / f"test_{chapter.module}.py": _tests(chapter),
    }


def _bug_name(exercise: Exercise) -> str:
    return f"todo-{exercise.name.lower().replace('_', '-')}-doubled"


def _solution(chapter: Chapter) -> str:
    functions = "".join(f'''

def {exercise.name}(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION
''' for exercise in chapter.exercises)
    return f'''"""Chapter {chapter.number}: {chapter.title}.

TODO: what the chapter's exercises build, in a sentence or two. The lesson
is chapters/{chapter.folder}/README.md.
"""

import torch
{functions}'''


def _checks(chapter: Chapter) -> str:
    checks = "".join(f'''

# -- {exercise.name} {"-" * max(3, 86 - len(exercise.name))}

# (id, shape): TODO: the shapes that matter (batch dimensions, one entry, ...).
{exercise.name.upper()}_CASES = [("B2-T3-d4", (2, 3, 4)), ("T1-d1", (1, 1))]


@exercise("{exercise.name}")
@pytest.mark.parametrize("case", {exercise.name.upper()}_CASES, ids=case_ids({exercise.name.upper()}_CASES))
def test_{exercise.name.lower()}_equals_the_oracle(submission, bugs, inputs, case):
    """equals TODO: the oracle, in words, for TODO: the cases"""
    _, shape = case
    x = inputs.randn(*shape)
    got, call = run(submission, "{exercise.name}", x)
    expect_close(got, oracles.{exercise.name}(x), call, lookalikes=bugs.{exercise.name}(x),
                 reference="TODO: the oracle's name")


@exercise("{exercise.name}")
def test_{exercise.name.lower()}_matches_reference(submission, reference, bugs, inputs):
    """matches the reference"""
    x = inputs.randn(2, 3, 4, dtype=torch.float64)
    got, call = run(submission, "{exercise.name}", x)
    expect_close(got, reference.{exercise.name}(x), call, lookalikes=bugs.{exercise.name}(x))
''' for exercise in chapter.exercises)
    portable = "".join(f'    portable("{exercise.name}", lambda inputs: ((inputs.randn(2, 3, 4),), {{}})),\n'
                       for exercise in chapter.exercises)
    return f'''"""Hidden checks for chapter {chapter.number}: {chapter.title}.

TODO: what the checks try, in a paragraph: the cases, the oracles they
compare with, what a failure says. Each check's docstring is the sentence a
student reads.
"""

import pytest
import torch

from grader.checks import Oracles, case_ids, exercise, portability_check, portable, run
from grader.compare import expect_close

# TODO: what the oracles compute (oracles.py).
oracles = Oracles("{chapter.id}")
{checks}

# -- every exercise -----------------------------------------------------------------------

test_would_run_on_a_gpu = portability_check([
{portable}])
'''


def _bugs(chapter: Chapter) -> str:
    bugs = "".join(f'''    # TODO: at least four known bugs of {exercise.name}, each a mistake students make.
    KnownBug("{exercise.name}", "{_bug_name(exercise)}", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
''' for exercise in chapter.exercises)
    return f'''"""Known bugs of chapter {chapter.number}: {chapter.title}.

Each is a one-line edit of the reference solution (``old`` to ``new``)
with the hint a student reads when their answer matches it; its lesson's
Pitfalls section names it in a ``<!-- known bugs: ... -->`` tag.
"""

from grader.chapters import KnownBug

BUGS = (
{bugs})
'''


def _oracles(chapter: Chapter) -> str:
    oracles = "".join(f'''

def {exercise.name}(x):
    """TODO: {exercise.name}'s answer computed another way than the reference (PyTorch's own, a loop)."""
    return x + 0.0
''' for exercise in chapter.exercises)
    names = ", ".join(f'"{exercise.name}"' for exercise in chapter.exercises)
    return f'''"""Chapter {chapter.number}'s oracles: TODO: what they compute, and how.

Shapes: x ``(..., d)``. TODO: every argument's.
"""

from __future__ import annotations

__all__ = [{names}]
{oracles}'''


def _lesson(chapter: Chapter) -> str:
    rows = "".join(f"| `{exercise.name}` | {exercise.points} | {exercise.summary} |\n" for exercise in chapter.exercises)
    tags = ", ".join(_bug_name(exercise) for exercise in chapter.exercises)
    return f"""# Chapter {chapter.number}: {chapter.title}

TODO: a paragraph: what the chapter builds, and why it matters.

## 1. TODO: the idea

TODO: the math, and every tensor's shape: `x` is `(..., d)`.

![TODO: what the figure shows](figures/{chapter.slug}.svg)

## 2. Pitfalls

- **TODO: a mistake, in words a student recognises**: what goes wrong, and
  how to see it. <!-- known bugs: {tags} -->

## 3. The exercises and how they are graded

TODO: what the checks try, in a paragraph. The list below is the checks'
own sentences, which `mha-course build` writes from their docstrings:

<!-- checks: begin -->
<!-- checks: end -->

| Exercise | Points | What it asks |
| --- | --- | --- |
{rows}| **Total** | **{chapter.points}** | |

Grade your work with `mha-course grade {chapter.id}`.
"""


def _figures(chapter: Chapter) -> str:
    return f'''"""Draws the figures of chapter {chapter.number}: ``figures()`` returns each SVG by its name in ``figures/``.

TODO: what the figures show, and from which fixed numbers (no randomness:
the same figures on every machine).
"""

from grader.figures import TOKENS, heatmap_svg


def figures() -> dict[str, str]:
    """``{{file name: SVG text}}`` for ``chapters/{chapter.folder}/figures/``."""
    causal = [[column <= row for column in range(len(TOKENS))] for row in range(len(TOKENS))]  # (T, T)
    weights = [[1.0 / (row + 1) if seen else 0.0 for seen in sees] for row, sees in enumerate(causal)]
    return {{
        "{chapter.slug}.svg": heatmap_svg(weights, TOKENS, TOKENS, "TODO: the figure's title",
                                          masked=[[not seen for seen in sees] for sees in causal]),
    }}
'''


def _notebook(chapter: Chapter) -> str:
    cells = "".join(f"""
# %% try {exercise.name}
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("{exercise.name}:", {exercise.name}(x))  # TODO: what a correct answer prints
""" for exercise in chapter.exercises)
    return f'''"""Chapter {chapter.number}'s notebook: the cells that try each exercise.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
A "# %% plot" cell, if any, draws from the student's own functions.
"""
# ruff: noqa: F821  (names come from the notebook's exercise cells)
{cells}'''


def _tests(chapter: Chapter) -> str:
    calls = "".join(f'        ("{exercise.name}", (draw.randn(2, 3, 4),), {{}}),  # TODO: calls that cover its contract\n'
                    for exercise in chapter.exercises)
    first = chapter.exercises[0]
    return f'''"""Chapter {chapter.number}'s own tests: TODO: what its checks say where the
whole-course tests (test_course.py, test_known_bugs.py) do not look."""

from conftest import Draw

# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py)."""
    return [
{calls}    ]


# A known bug of grader/chapters/{chapter.id}/bugs.py that tests/test_release.py makes in both trees.
RELEASE_BUG = ("{first.name}", "{_bug_name(first)}")
'''


def next_steps(chapter: Chapter) -> list[str]:
    """What is left once the skeleton is written, in the recipe's words."""
    return [
        "fill in every TODO of the files above (grep -rn TODO over them)",
        "give each exercise four known bugs at least, each named by a pitfall of its lesson",
        f"write three correct styles an exercise: tests/correct_styles/{chapter.id}_<style>.py",
        "mha-course build (the stub, the notebook, the figures)",
        ("python tests/test_same_grades.py (the grades snapshot), then mha-course verify "
         "and python -m pytest tests/test_chapter_parts.py"),
    ]
