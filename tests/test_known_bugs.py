"""Every known bug is caught by the checks, and the feedback names it; an
exercise's mistakes cost only the exercises built on it."""

import types

import pytest
import torch

from conftest import (SOLUTION, affected_by, limits_for, replace_function, result_of, solution_source,
                      statuses, stub_source)
from grader.catalog import CHAPTERS
from grader.known_bugs import (KNOWN_BUGS, Lookalikes, apply_bug, apply_bugs, buggy_modules, combined_modules,
                               function_span)
from grader.relations import RelationHint

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


def test_a_wrong_answer_like_no_known_bug_gets_no_known_bugs_hint(grade_source):
    """The output doubled: no known bug gives it, so no known bug's hint;
    the relation it bears (a factor of 2, ``grader.relations``) names it."""
    source = SOLUTION.replace("return weights @ v, weights  # (..., L, d_v), (..., L, S)",
                              "return weights @ v * 2, weights")
    report = grade_source(source)
    result = result_of(report, "scaled_dot_product_attention")
    assert result.status == "failed"
    assert all(check.hint is None or check.relation == "factor" for check in result.failed_checks)
    assert any(check.relation == "factor" for check in result.failed_checks)


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


def _bug(exercise: str, name: str):
    return next(bug for bug in KNOWN_BUGS["ch01"] if (bug.exercise, bug.name) == (exercise, name))


def test_one_slip_made_on_every_line_gets_its_hint(grade_source):
    """All three projections without .T: three bugs of one hint, made together."""
    slips = [_bug("self_attention", name) for name in ("x-times-w", "x-times-w-for-keys", "x-times-w-for-values")]
    report = grade_source(apply_bugs(SOLUTION, slips))
    result = result_of(report, "self_attention")
    assert result.status == "failed"
    # The checks that compare with the reference name it; the others (PyTorch's answer) cannot.
    assert {check.hint for check in result.failed_checks} - {None} == {slips[0].hint}


def test_two_catalogued_mistakes_made_together_are_both_named(grade_source):
    unscaled, over_queries = _bug("scaled_dot_product_attention", "no-scale"), \
        _bug("scaled_dot_product_attention", "softmax-over-queries")
    report = grade_source(apply_bugs(SOLUTION, [unscaled, over_queries]))
    hints = {check.hint for check in result_of(report, "scaled_dot_product_attention").failed_checks}
    together = [hint for hint in hints - {None} if hint.startswith("looks like two mistakes together: ")]
    assert len(together) == 1, hints
    assert unscaled.hint.removeprefix("looks like ") in together[0]
    assert over_queries.hint.removeprefix("looks like ") in together[0]
    # Where d_k = 1 the scale is 1, and the softmax's axis alone explains the answer.
    assert hints - {None} <= {together[0], over_queries.hint}


def test_a_single_bug_that_explains_an_answer_wins_over_any_combination():
    x = torch.randn(2, 3, 5)
    hints = [hint for hint, _ in Lookalikes(CHAPTERS[0], "softmax", (x,), {"dim": -1})()]
    singles = len(KNOWN_BUGS["ch01"])  # every bug of the chapter runs; the exercise's own first
    assert sorted(hints[:singles]) == sorted(bug.hint for bug in KNOWN_BUGS["ch01"])
    assert len(hints) > singles
    # Then the combinations, then the relations' variants of the call (``grader.relations``).
    later = [isinstance(hint, RelationHint) for hint in hints[singles:]]
    assert later == sorted(later) and not all(later)
    assert all(hint.startswith("looks like two mistakes together") for hint in hints[singles:]
               if not isinstance(hint, RelationHint))


def _code(code: types.CodeType) -> types.CodeType:
    """``code`` without where it was compiled: the file's name, and its line
    numbers (an edit of two lines into one moves every later function)."""
    consts = tuple(_code(const) if isinstance(const, types.CodeType) else const for const in code.co_consts)
    return code.replace(co_filename="", co_firstlineno=1, co_linetable=b"", co_consts=consts)


def _definitions(module) -> dict[str, object]:
    """A module's functions and classes as their code: a class as the methods of
    every class of its own module it is made of (a subclass, its base)."""
    found = {}
    for name, value in vars(module).items():
        if isinstance(value, types.FunctionType):
            found[name] = _code(value.__code__)
        elif isinstance(value, type) and value.__module__ == module.__name__:
            found[name] = [(klass.__qualname__, {key: _code(item.__code__) for key, item in vars(klass).items()
                                                 if isinstance(item, types.FunctionType)})
                           for klass in value.__mro__ if klass.__module__ == module.__name__]
    return found


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda chapter: chapter.id)
def test_a_bug_module_built_from_its_edited_definition_is_the_edited_file(chapter):
    """known_bugs compiles only an edited exercise (and its subclasses) over
    the reference; the functions and classes must be those of the whole
    edited file compiled, for every bug and every combination."""
    source = solution_source(chapter)
    for bug, module in buggy_modules(chapter):
        whole = types.ModuleType(module.__name__)
        exec(compile(apply_bug(source, bug), module.__name__, "exec", dont_inherit=True), whole.__dict__)
        assert _definitions(module) == _definitions(whole), bug.name
    for exercise in chapter.exercises:
        for combination, module in combined_modules(chapter, exercise.name):
            whole = types.ModuleType(module.__name__)
            exec(compile(apply_bugs(source, combination.parts), module.__name__, "exec", dont_inherit=True),
                 whole.__dict__)
            assert _definitions(module) == _definitions(whole), combination.name
