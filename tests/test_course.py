"""The whole course: the reference solutions score full marks on every chapter
(whatever the seed), and the untouched stubs score nothing; every lesson
shows its figures and lists its exercises."""

import importlib.util
import re
import subprocess
import xml.etree.ElementTree as ElementTree

import pytest
import torch

from conftest import FAST, TRAINING
from grader.catalog import CHAPTERS, COURSE_ROOT
from grader.grading import grade


def _targets(folder: str):
    return [(chapter, COURSE_ROOT / folder / chapter.file_name) for chapter in CHAPTERS]


@pytest.mark.parametrize("seed", [0, 1, 20261122])
def test_the_solutions_score_full_marks_on_every_chapter(seed):
    report = grade(_targets("solutions"), limits=TRAINING, seed=seed)
    failed = [f"{result.chapter.id} {result.exercise.name}: {result.reason}"
              for result in report.exercises if result.status != "passed"]
    assert not failed
    assert report.score == report.max_score == sum(chapter.points for chapter in CHAPTERS)


def test_the_stubs_score_zero_and_every_exercise_is_not_implemented():
    report = grade(_targets("exercises"), limits=FAST)
    assert report.score == 0
    assert {r.status for r in report.exercises if not r.exercise.optional} == {"not implemented"}
    assert {r.status for r in report.exercises if r.exercise.optional} == {"not attempted"}
    assert len(report.exercises) == sum(len(chapter.exercises) for chapter in CHAPTERS)


# -- every lesson ---------------------------------------------------------------------


def _figures(chapter) -> dict[str, str]:
    """What the chapter's figures.py draws: ``{file name: SVG text}``."""
    path = COURSE_ROOT / "chapters" / chapter.folder / "figures.py"
    spec = importlib.util.spec_from_file_location(f"figures_{chapter.module}_for_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.figures()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_figures_are_deterministic_svg_and_the_lesson_shows_them(chapter):
    lesson = COURSE_ROOT / "chapters" / chapter.folder
    figures = _figures(chapter)
    assert figures and figures == _figures(chapter)
    for name, text in figures.items():
        assert ElementTree.fromstring(text).tag == "{http://www.w3.org/2000/svg}svg", name
        assert (lesson / "figures" / name).read_text(encoding="utf-8") == text, f"run mha-course build ({name})"
    shown = re.findall(r"!\[[^\]]*\]\(figures/([^)]+)\)", (lesson / "README.md").read_text(encoding="utf-8"))
    assert set(shown) == set(figures)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_the_lesson_lists_each_exercise_with_its_points(chapter):
    lesson = chapter.lesson().read_text(encoding="utf-8")
    for exercise in chapter.exercises:
        # | `name` | 2 | or | `name(arguments)` | 2 | or, optional, | `name` | optional, 0 |
        row = re.search(rf"^\| `{exercise.name}(\(.*?\))?` \| (optional, )?(\d+) \|", lesson, flags=re.MULTILINE)
        assert row is not None and int(row.group(3)) == exercise.points, exercise.name
        assert bool(row.group(2)) == exercise.optional, exercise.name
    assert f"**{chapter.points}**" in lesson
    assert f"mha-course grade {chapter.id}" in lesson


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_no_lesson_or_notebook_shows_an_exercise_s_solution(chapter):
    """A lesson teaches an exercise in words, shapes and the odd line: its
    text, the notebook's try and plot cells, the built notebook and the stub
    hold no three consecutive code lines of a solution (the whole of a
    shorter one), compared without comments or alignment."""
    from grader.edition import revealing_passages

    folder = COURSE_ROOT / "chapters" / chapter.folder
    found = [passage for path in (folder / "README.md", folder / "notebook.py", chapter.notebook(), chapter.stub())
             for passage in revealing_passages(path)]
    assert not found, found


def test_the_search_for_a_solution_sees_through_comments_and_alignment(tmp_path):
    """The test above is not vacuous: a solution block pasted into a lesson's
    code with its comments rewritten and its columns aligned is found."""
    from grader.edition import revealing_passages, solution_blocks

    block = max(solution_blocks(), key=len)
    lesson = tmp_path / "README.md"
    lesson.write_text("```python\n>>> " + "\n".join(f"{line}      # step {n}" for n, line in enumerate(block))
                      + "\n```\n", encoding="utf-8")
    assert len(revealing_passages(lesson)) == len(block) - 2


# -- the README's figures -------------------------------------------------------------------

README = COURSE_ROOT / "README.md"
# A figure with a unit of time or size: a measurement, unless it is one of these.
MEASURED = re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|s|min|KB|MB|GB|KiB|MiB|GiB)\b")
SETTINGS = {
    "64 MiB": "the largest file a worker may write, an rlimit (grader/isolation.py)",
    "768 MB": "Gradescope's default memory for an autograder, not a figure of ours",
    "600 s": "PrairieLearn's cap on a grading job's timeout",
    "1 MiB": "PrairieLearn's limit on a job's results.json",
}


def _readme_paragraphs() -> list[str]:
    """The README's paragraphs and list items, each on one line."""
    text = README.read_text(encoding="utf-8")
    return [" ".join(part.split()) for block in text.split("\n\n") for part in re.split(r"\n(?=- )", block)]


def test_every_measured_figure_of_the_readme_says_when_and_which_bench_script():
    """A time or a size measured on one machine goes stale as the code
    changes: beside it, the date it was measured and the script in bench/
    that measures it again."""
    unsourced = []
    for paragraph in _readme_paragraphs():
        figures = [figure for figure in MEASURED.findall(paragraph) if figure not in SETTINGS]
        scripts = [name for name in re.findall(r"\b(\w+\.py)\b", paragraph) if (COURSE_ROOT / "bench" / name).is_file()]
        if figures and not (re.search(r"\b20\d\d-\d\d-\d\d\b", paragraph) and scripts):
            unsourced.append(f"{', '.join(figures)}: {paragraph[:80]}")
    assert not unsourced, unsourced


def test_the_readme_counts_no_tests_and_counts_the_corpus_right():
    """The suite's count changes with every test: the README gives none. The
    corpus of correct styles it counts is the one tests/ holds."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert not re.findall(r"\b\d[\d,]* tests\b", text)
    corpus = len(list((COURSE_ROOT / "tests" / "correct_styles").glob("ch*.py")))
    counted = re.findall(r"`tests/correct_styles/` holds (\d+) whole chapters", text)
    assert counted and all(int(count) == corpus for count in counted), (counted, corpus)


# -- the README's table of chapters ---------------------------------------------------------

# A row of it: | [01](chapters/01_self_attention/README.md) | topic | exercises |
CHAPTER_ROW = re.compile(r"\| \[(\d+)\]\(([^)\s]+)\) \| [^|]*\S[^|]* \| [^|]*\S[^|]* \|")


def test_the_readme_has_a_row_a_chapter_in_the_catalog_s_order():
    """README.md's "## Chapters" table: one row a chapter of the catalog, in
    its order, the number linking to the lesson, then a topic and the exercises."""
    text = README.read_text(encoding="utf-8")
    assert "\n## Chapters\n" in text, "README.md has no ## Chapters section"
    start = text.index("\n## Chapters\n") + 1
    end = text.find("\n## ", start)
    lines = [line for line in text[start:end if end >= 0 else None].splitlines() if line.startswith("| [")]
    malformed = [line for line in lines if not CHAPTER_ROW.fullmatch(line)]
    assert not malformed, f"README.md's ## Chapters table: rows not of the form {CHAPTER_ROW.pattern}: {malformed}"
    rows = [CHAPTER_ROW.fullmatch(line).groups() for line in lines]
    wanted = [(f"{chapter.number:02d}", f"chapters/{chapter.folder}/README.md") for chapter in CHAPTERS]
    missing = [f"| [{number}]({link}) | topic | exercises |" for number, link in wanted if (number, link) not in rows]
    assert not missing, f"README.md's ## Chapters table has no row for a chapter of the catalog; add {missing}"
    assert rows == wanted, f"README.md's ## Chapters table: {rows}, where the catalog has {wanted}"


# -- the prepared GPU run ---------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs the whole check")
def test_the_device_check_says_in_one_line_that_there_is_no_cuda():
    """bench/device_check.sh is run first on any machine with a GPU; on one
    without, it answers in one line and succeeds, so that a script that runs
    it everywhere is not failed by a CPU machine."""
    done = subprocess.run(["bash", str(COURSE_ROOT / "bench" / "device_check.sh")], capture_output=True,
                          text=True, timeout=120, cwd=COURSE_ROOT / "chapters")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    (line,) = done.stdout.splitlines()
    assert line.startswith("device_check: no CUDA device here (torch ") and line.endswith("nothing to check")
