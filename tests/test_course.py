"""The whole course: the reference solutions score full marks on every chapter
(whatever the seed), and the untouched stubs score nothing."""

import pytest

from conftest import FAST
from grader.catalog import CHAPTERS, COURSE_ROOT
from grader.grading import grade


def _targets(folder: str):
    return [(chapter, COURSE_ROOT / folder / f"{chapter.module}.py") for chapter in CHAPTERS]


@pytest.mark.parametrize("seed", [0, 1, 20261122])
def test_the_solutions_score_full_marks_on_every_chapter(seed):
    report = grade(_targets("solutions"), limits=FAST, seed=seed)
    failed = [f"{result.chapter.id} {result.exercise.name}: {result.reason}"
              for result in report.exercises if result.status != "passed"]
    assert not failed
    assert report.score == report.max_score == sum(chapter.points for chapter in CHAPTERS)


def test_the_stubs_score_zero_and_every_exercise_is_not_implemented():
    report = grade(_targets("exercises"), limits=FAST)
    assert report.score == 0
    assert {r.status for r in report.exercises} == {"not implemented"}
    assert len(report.exercises) == sum(len(chapter.exercises) for chapter in CHAPTERS)
