"""Every known bug is caught by the checks, and the feedback names it; an
exercise's mistakes cost only the exercises built on it."""

import pytest
import torch

from conftest import (SOLUTION, affected_by, limits_for, replace_function, result_of, solution_source,
                      statuses, stub_source)
from grader.catalog import CHAPTERS
from grader.known_bugs import KNOWN_BUGS, Lookalikes, apply_bug, function_span

ALL_BUGS = [(chapter, bug) for chapter in CHAPTERS for bug in KNOWN_BUGS[chapter.id]]
EXERCISES = [(chapter, exercise) for chapter in CHAPTERS for exercise in chapter.exercises]


@pytest.mark.parametrize("chapter, bug", ALL_BUGS,
                         ids=[f"{chapter.id}/{bug.exercise}/{bug.name}" for chapter, bug in ALL_BUGS])
def test_known_bug_fails_its_exercise_and_is_named(verification, chapter, bug):
    """From the suite's one ``verify`` run, which graded the reference with
    each known bug in against the checks of the bug's exercise."""
    (audit,) = [audit for audit in verification.exercises
                if (audit.chapter.id, audit.exercise.name) == (chapter.id, bug.exercise)]
    assert audit.catches[bug.name], f"no check catches {bug.name}"
    assert bug.hint in audit.hints[bug.name]


@pytest.mark.parametrize("chapter, exercise", EXERCISES,
                         ids=[f"{chapter.id}/{exercise.name}" for chapter, exercise in EXERCISES])
def test_an_exercise_left_as_its_stub_costs_only_the_exercises_built_on_it(grade_source, chapter, exercise):
    """The reference with one exercise put back as its stub, whose every call
    raises: the exercises that do not build on it keep their points. So no
    check of theirs calls it, and a known bug in it (caught above) costs
    them nothing."""
    stub = stub_source(chapter)
    start, end = function_span(stub, exercise.name)
    source = replace_function(solution_source(chapter), exercise.name, stub[start:end])
    assert source != solution_source(chapter)
    # Chapter 8's training takes about a second: the default limits, not FAST's, beside other tests.
    report = grade_source(source, chapter=chapter.id, limits=limits_for([chapter]))
    affected = affected_by(chapter, exercise.name)
    assert statuses(report)[exercise.name] != "passed"
    assert set(statuses(report)) == {other.name for other in chapter.exercises}
    for name, status in statuses(report).items():
        if name not in affected:
            assert status == "passed", f"{name} should not be affected by {exercise.name} left as its stub"


def test_the_bugs_the_course_promises_to_catch_are_in_the_catalog():
    names = {bug.name for bug in KNOWN_BUGS["ch01"]}
    assert {"no-scale", "softmax-over-queries", "no-max-shift", "mask-inverted",
            "weights-transposed"} <= names


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_every_exercise_has_known_bugs(chapter):
    assert {bug.exercise for bug in KNOWN_BUGS[chapter.id]} == {e.name for e in chapter.exercises}


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_bug_names_are_unique_within_an_exercise(chapter):
    keys = [(bug.exercise, bug.name) for bug in KNOWN_BUGS[chapter.id]]
    assert len(keys) == len(set(keys))


def test_a_wrong_answer_like_no_known_bug_gets_no_hint(grade_source):
    source = SOLUTION.replace("return weights @ v, weights  # (..., L, d_v), (..., L, S)",
                              "return weights @ v * 2, weights")
    report = grade_source(source)
    result = result_of(report, "scaled_dot_product_attention")
    assert result.status == "failed"
    assert all(check.hint is None for check in result.failed_checks)


def test_a_bug_edit_must_match_the_solution_exactly():
    bug = KNOWN_BUGS["ch01"][0]
    with pytest.raises(ValueError, match="occurs 0 times"):
        apply_bug(SOLUTION, bug.__class__("softmax", "x", "hint", "no such line", "y"))



def test_a_bug_already_matched_in_the_run_is_tried_first():
    x = torch.randn(2, 3, 5)
    plain = [hint for hint, _ in Lookalikes(CHAPTERS[0], "softmax", (x,), {"dim": -1})()]
    seen: list[str] = []
    lookalikes = Lookalikes(CHAPTERS[0], "softmax", (x,), {"dim": -1}, seen=seen)
    assert [hint for hint, _ in lookalikes()] == plain
    seen.append(plain[3])  # a later check of the run matched this one
    reordered = [hint for hint, _ in lookalikes()]
    assert reordered[0] == plain[3] and sorted(reordered) == sorted(plain)
