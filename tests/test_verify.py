"""``mha-course verify`` proves the course's checks, and reports every gap."""

import shutil

from rich.console import Console

from conftest import ADDED_BUGS, ALIKE
from grader.catalog import CHAPTERS, COURSE_ROOT, find_chapter
from grader.known_bugs import KNOWN_BUGS
from grader.report import print_verification
from grader.verify import MIN_BUGS, ExerciseAudit, verify


def test_work_in_exercises_is_named_in_one_line_and_is_no_gap(verification):
    assert verification.stale == verification.edited == [verification.work]
    console = Console(width=80, record=True, color_system=None)
    print_verification(verification, console)
    text = console.export_text()
    assert "out of date" not in text
    assert ("note: exercises/ holds work in ch01_self_attention.py; the stubs were graded as the "
            "build writes them") in " ".join(text.split())


def test_every_exercise_is_audited(verification):
    audited = [(audit.chapter.id, audit.exercise.name) for audit in verification.exercises]
    assert audited == [(chapter.id, exercise.name) for chapter in CHAPTERS for exercise in chapter.exercises]


def test_the_reference_passes_and_the_stub_fails_every_check(verification):
    for audit in verification.exercises:
        assert audit.checks, audit.exercise.name
        assert audit.reference_failures == [], audit.exercise.name
        assert audit.stub_passes == [], audit.exercise.name


def test_every_catalog_bug_is_caught_and_named_and_the_added_ones_are_the_only_gaps(verification):
    gaps = [(audit.exercise.name, gap) for audit in verification.exercises for gap in audit.gaps]
    assert gaps == [("softmax", "no check catches the known bug harmless-comment"),
                    ("softmax", "no check's hint names the known bug sum-of-everything-again")]
    assert not verification.passed
    softmax = verification.exercises[0]
    assert softmax.catches[ALIKE.name] == softmax.catches["sum-of-everything"]
    assert softmax.hints[ALIKE.name] == softmax.hints["sum-of-everything"] != set()
    for audit in verification.exercises:
        expected = [bug.name for bug in KNOWN_BUGS[audit.chapter.id] if bug.exercise == audit.exercise.name]
        if audit.exercise.name == "softmax":
            expected += [bug.name for bug in ADDED_BUGS]
        assert list(audit.catches) == expected
        for bug, checks in audit.catches.items():
            assert checks <= set(audit.checks), f"{bug} is caught by checks that did not run"


def test_no_bug_escapes_the_checks_of_its_own_exercise(verification):
    softmax = next(audit for audit in verification.exercises if audit.exercise.name == "softmax")
    assert softmax.catches["sum-of-everything"] >= {"matches the reference [3x5-dim0]"}
    assert softmax.catches["no-max-shift"] == {"stays finite for huge logits [logits-1e2]",
                                               "stays finite for huge logits [logits-1e4]"}


def test_the_table_shows_each_exercise_and_the_gap(verification):
    console = Console(width=80, record=True, color_system=None)
    print_verification(verification, console, matrix=True)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    softmax = verification.exercises[0]
    most = max(len(checks) for checks in softmax.catches.values())
    softmax_row = next(line for line in lines if line.split()[:1] == ["softmax"])
    assert softmax_row.split()[1:] == [str(len(softmax.checks)), "✓", "✓", "5/6", f"0–{most}"]
    assert "✗ ch01 softmax: no check catches the known bug harmless-comment" in lines
    assert "✗ ch01 softmax: no check's hint names the known bug sum-of-everything-again" in lines
    assert lines[-1].startswith(f"gaps found: {sum(len(chapter.exercises) for chapter in CHAPTERS)} exercises")
    # The matrix: a numbered legend of the bugs, a row per check, a count per bug.
    assert "   5  harmless-comment" in lines
    counts = next(line for line in lines if line.startswith("checks catching it"))
    assert counts.split()[3:] == [str(len(checks)) for checks in softmax.catches.values()]


def test_too_few_known_bugs_is_a_gap():
    chapter = find_chapter("ch01")
    audit = ExerciseAudit(chapter, chapter.exercises[0], checks=["a"],
                          catches={f"bug-{n}": {"a"} for n in range(MIN_BUGS - 1)})
    assert audit.gaps == [f"only {MIN_BUGS - 1} known bug(s) in the catalog; at least {MIN_BUGS} are expected"]


def test_one_chapter_is_proven_alone_and_only_its_generated_files_are_judged(tmp_path):
    """``verify --chapter ch02``: ch02's exercises and known bugs, and ch02's
    figure out of date is a gap where another chapter's is not."""
    for name in ("solutions", "chapters", "exercises", "grader"):
        shutil.copytree(COURSE_ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    ch02, ch03 = find_chapter("ch02"), find_chapter("ch03")
    figures = [tmp_path / "chapters" / chapter.folder / "figures" / name
               for chapter, name in ((ch02, "padded_batch.svg"), (ch03, "split_heads.svg"))]
    for figure in figures:
        figure.write_text("<svg/>", encoding="utf-8")
    found = verify(seed=0, jobs=2, root=tmp_path, chapters=(ch02,))
    assert [audit.exercise.name for audit in found.exercises] == [exercise.name for exercise in ch02.exercises]
    assert all(audit.gaps == [] for audit in found.exercises)
    assert sum(len(audit.catches) for audit in found.exercises) == len(KNOWN_BUGS["ch02"])
    assert found.stale == figures[:1] and not found.passed

