"""The catalog is the one list of exercises: solutions, stubs and checks agree with it."""

import ast
import re
from pathlib import Path

import pytest

from grader.catalog import CHAPTERS, COURSE_ROOT, UnknownChapter, chapter_for_file, find_chapter


@pytest.mark.parametrize("target", ["ch01", "1", "01", "CH01", "01_self_attention",
                                    "ch01_self_attention", "self_attention"])
def test_every_way_of_naming_chapter_one(target):
    assert find_chapter(target).number == 1


@pytest.mark.parametrize("target", ["nonsense", "ch99", "0", "", "ch01_typo"])
def test_unknown_chapters_are_refused(target):
    with pytest.raises(UnknownChapter, match="unknown chapter"):
        find_chapter(target)


def test_a_file_is_matched_to_its_chapter_by_name():
    assert chapter_for_file(Path("somewhere/ch01_my_attempt.py")).number == 1
    # The rule batch and Gradescope use: chNN as a word anywhere in the name.
    assert chapter_for_file(Path("alice_ch03.ipynb")).number == 3
    with pytest.raises(UnknownChapter, match="cannot tell which chapter"):
        chapter_for_file(Path("rich01.py"))
    with pytest.raises(UnknownChapter, match="cannot tell which chapter"):
        chapter_for_file(Path("attention.py"))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.id for c in CHAPTERS])
def test_each_chapter_has_its_files(chapter):
    assert chapter.solution().is_file()
    assert chapter.stub().is_file()
    assert chapter.notebook().is_file()
    assert chapter.lesson().is_file()
    assert chapter.checks.is_file()
    assert chapter.bugs().is_file()
    # Each names its own chapter's file, in the folder it is given.
    for path in (chapter.solution(), chapter.stub(), chapter.notebook(), chapter.checks, chapter.bugs()):
        assert chapter.id in str(path.relative_to(COURSE_ROOT))
    assert chapter.solution(Path("elsewhere")) == Path("elsewhere", "solutions", chapter.file_name)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.id for c in CHAPTERS])
def test_checks_judge_exactly_the_catalogs_exercises(chapter):
    source = chapter.checks.read_text()
    judged = set(re.findall(r'@exercise\("(\w+)"\)', source))
    assert judged == {exercise.name for exercise in chapter.exercises}
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            decorators = [ast.unparse(d) for d in node.decorator_list]
            assert any(d.startswith("exercise(") for d in decorators), f"{node.name} has no @exercise"
            assert ast.get_docstring(node), f"{node.name} has no docstring: it is the check's name"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.id for c in CHAPTERS])
def test_uses_name_earlier_exercises_of_the_chapter(chapter):
    seen = set()
    for exercise in chapter.exercises:
        assert set(exercise.uses) <= seen
        assert (exercise.points > 0) != exercise.optional  # an optional one is worth nothing
        seen.add(exercise.name)
