"""Chapters graded side by side in forked copies of the grader give the same report."""

from __future__ import annotations

import os
import time

import pytest

from grader.catalog import CHAPTERS, find_chapter
from grader.grading import GraderError, grade
from grader.known_bugs import KNOWN_BUGS, apply_bug
from grader.side_by_side import ForkedCopyDied, run_side_by_side
from tests.conftest import FAST, TRAINING, solution_source


PARENT = os.getpid()


def _square_with_pid(item: int, _) -> tuple[int, int]:
    time.sleep(0.05)  # long enough that every process gets a turn
    return item * item, os.getpid()


def test_every_item_is_done_once_and_comes_back_in_order():
    outcomes = run_side_by_side(list(range(8)), _square_with_pid, processes=3)
    assert [square for square, _ in outcomes] == [i * i for i in range(8)]
    assert len({pid for _, pid in outcomes}) > 1  # not all in this process


def _fail_on_seven(item: int, _) -> int:
    if item == 7:
        raise GraderError(f"item {item} broke")
    return item


def test_an_error_in_a_forked_copy_is_raised_here_as_itself():
    with pytest.raises(GraderError, match="item 7 broke"):
        run_side_by_side(list(range(10)), _fail_on_seven, processes=2)


def _copies_die(item: int, _) -> int:
    if os.getpid() != PARENT:
        os._exit(9)  # the copy dies without a word, its item undone
    time.sleep(0.05)  # this process is slow, so the copy surely takes an item
    return item


def test_a_copy_that_dies_is_an_error_not_a_hang():
    with pytest.raises(ForkedCopyDied, match="died"):
        run_side_by_side(list(range(6)), _copies_die, processes=2)


def _write_course(folder, bugs: dict[str, int]):
    """The reference solutions in ``folder``, with known bug number ``bugs[id]`` in some chapters."""
    targets = []
    for chapter in CHAPTERS:
        source = solution_source(chapter)
        if chapter.id in bugs:
            source = apply_bug(source, KNOWN_BUGS[chapter.id][bugs[chapter.id]])
        if chapter.id == "ch02":  # a note about the file, which must come back too
            source += "\nprint(undefined_name)\n"
        path = folder / chapter.file_name
        path.write_text(source, encoding="utf-8")
        targets.append((chapter, path))
    return targets


def test_side_by_side_grades_like_one_process(tmp_path):
    targets = _write_course(tmp_path, {"ch01": 0, "ch03": 2, "ch05": 1})
    alone = grade(targets, limits=TRAINING, seed=7, jobs=1)
    side_by_side = grade(targets, limits=TRAINING, seed=7, jobs=3)

    def verdicts(report):
        return [(r.chapter.id, r.exercise.name, r.status, r.reason,
                 [(c.check, c.outcome, c.message, c.hint) for c in r.checks]) for r in report.exercises]

    assert verdicts(side_by_side) == verdicts(alone)
    assert side_by_side.notes == alone.notes and "ch02" in alone.notes
    assert not alone.passed and sum(r.status == "passed" for r in alone.exercises) > 10


def test_a_single_chapter_is_graded_here(tmp_path):
    chapter = find_chapter("ch04")
    path = tmp_path / chapter.file_name
    path.write_text(solution_source(chapter), encoding="utf-8")
    assert grade([(chapter, path)], limits=FAST, seed=1, jobs=4).passed
