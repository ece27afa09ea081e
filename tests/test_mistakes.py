"""The corpus of uncatalogued mistakes (``tests/mistakes/``) is sound, and a
grade names their relations, live and in the student edition.

The corpus walks the catalog: each chapter has its file, each exercise at
least ``MIN_MISTAKES`` mistakes, each an edit that applies to the reference
once, labelled with relations the grader knows, and none the edit of a
catalogued bug. ``bench/hints.py`` measures the whole corpus; here a few
mistakes, one of each way a relation is found, go through a real grade.
"""

from __future__ import annotations

import ast
import json

import pytest
from mistakes import MIN_MISTAKES, of_chapter

from grader import recorded, relations
from grader.catalog import CHAPTERS, COURSE_ROOT, find_chapter
from grader.grading import grade
from grader.known_bugs import KNOWN_BUGS, apply_bug

CORPUS = COURSE_ROOT / "tests" / "mistakes"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_every_exercise_has_its_mistakes_each_an_edit_of_the_reference(chapter):
    assert (CORPUS / f"{chapter.id}.py").is_file(), \
        f"tests/mistakes/{chapter.id}.py is missing: write its MISTAKES (grader/README.md, 'Adding a chapter')"
    found = of_chapter(chapter.id)
    for exercise in chapter.exercises:
        count = sum(mistake.exercise == exercise.name for mistake in found)
        assert count >= MIN_MISTAKES, f"{chapter.id} {exercise.name}: {count} mistakes, at least {MIN_MISTAKES}"
    keys = [(mistake.exercise, mistake.name) for mistake in found]
    assert len(keys) == len(set(keys)), "a mistake's name is used twice within an exercise"
    catalogued = {(bug.exercise, bug.old, bug.new) for bug in KNOWN_BUGS[chapter.id]}
    source = chapter.solution().read_text(encoding="utf-8")
    for mistake in found:
        assert (mistake.exercise, mistake.old, mistake.new) not in catalogued, f"{mistake.name} is a known bug"
        assert set(mistake.relations) <= set(relations.NAMES), f"{mistake.name}: {mistake.relations}"
        edited = apply_bug(source, mistake)  # raises unless the edit is found once
        assert edited != source
        ast.parse(edited)


def _mistake(chapter_id: str, exercise: str, name: str):
    return next(mistake for mistake in of_chapter(chapter_id) if (mistake.exercise, mistake.name) == (exercise, name))


def _relations(report, exercise: str) -> set[str]:
    (result,) = [result for result in report.exercises if result.exercise.name == exercise]
    return {name for check in result.failed_checks if check.relation for name in check.relation.split("+")}


# One mistake for each way a relation is found: from the answer alone, from the
# reference on changed inputs (a variant of the call), and from a count.
@pytest.mark.parametrize("corpus, name, exercise, chapter_id", [
    ("ch01", "log-softmax-formula", "softmax", "ch01"),
    ("ch01", "scale-by-model-width", "self_attention", "ch01"),
    ("ch03", "two-linears", "parameter_count", "ch03"),
], ids=["from-the-answer", "from-a-variant-of-the-call", "from-a-count"])
def test_a_grade_names_the_relation_of_a_mistake(grade_source, corpus, name, exercise, chapter_id):
    mistake = _mistake(corpus, exercise, name)
    chapter = find_chapter(chapter_id)
    report = grade_source(apply_bug(chapter.solution().read_text(encoding="utf-8"), mistake),
                          chapter=chapter_id, only={exercise})
    assert set(mistake.relations) & _relations(report, exercise), report.exercises[0].reason
    (result,) = report.exercises
    assert any(check.relation and result.reason.startswith(check.hint) for check in result.failed_checks), \
        result.reason  # the verdict line names it


@pytest.mark.parametrize("exercise, name, relation", [
    ("self_attention", "scale-by-model-width", "scale"),
    ("softmax", "mean-instead-of-sum", relations.EDIT),
], ids=["a-variant-of-the-call", "an-edit-of-the-reference"])
def test_the_student_edition_replays_a_variants_hint(tmp_path, exercise, name, relation):
    """A variant's answer is the reference's on changed inputs, and an
    edit's is an edited reference's (``grader.edits``), which the edition
    cannot compute: each is recorded with the known bugs' lookalikes and
    its hint replayed."""
    chapter = find_chapter("ch01")
    mistake = _mistake("ch01", exercise, name)
    only, seed = {mistake.exercise}, 5
    recorder = recorded.Recorder()
    grade([(chapter, chapter.solution())], seed=seed, only=only, mode=recorder)
    recorder.recordings["ch01"].save(tmp_path / "ch01.rec")
    (tmp_path / recorded.INDEX).write_text(json.dumps({"format": recorded.FORMAT, "seeds": [seed]}),
                                           encoding="utf-8")
    path = tmp_path / chapter.file_name
    path.write_text(apply_bug(chapter.solution().read_text(encoding="utf-8"), mistake), encoding="utf-8")
    live = grade([(chapter, path)], seed=seed, only=only)
    replayed = grade([(chapter, path)], seed=seed, only=only, mode=recorded.Replayer(tmp_path))
    assert relation in _relations(live, mistake.exercise)
    assert [(check.hint, check.relation) for check in replayed.exercises[0].checks] == \
        [(check.hint, check.relation) for check in live.exercises[0].checks]
