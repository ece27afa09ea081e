"""``mha-course verify``: prove the checks against the course's own material.

For every exercise: the reference passes every check, the untouched stub
fails every check, and every known bug of the catalog fails at least one
check, one of which gives the bug's hint. And the generated files (stubs,
notebooks, figures) are what the build writes. Each catalog bug is graded
on its own, against its exercise's checks only, in processes forked from
this one (torch is already imported there).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grader import recorded
from grader.build import edited_files, generated_files, stale_files, write_stubs
from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter, Exercise, find_chapter, is_student_edition
from grader.grading import GraderError, grade
from grader.known_bugs import KNOWN_BUGS, apply_bug
from grader.sandbox import preload
from grader.side_by_side import forked_pool

MIN_BUGS = 4  # known bugs an exercise's catalog must hold


@dataclass
class ExerciseAudit:
    """What ``verify`` found for one exercise; ``gaps`` lists what is wrong."""

    chapter: Chapter
    exercise: Exercise
    checks: list[str] = field(default_factory=list)  # titles of the checks that ran on the reference
    reference_failures: list[str] = field(default_factory=list)  # checks the reference fails
    stub_passes: list[str] = field(default_factory=list)  # checks the stub passes
    catches: dict[str, set[str]] = field(default_factory=dict)  # bug name -> checks it fails
    hints: dict[str, set[str]] = field(default_factory=dict)  # bug name -> hints its failed checks gave
    unnamed: list[str] = field(default_factory=list)  # bugs caught, but no hint gave their own

    @property
    def missed_bugs(self) -> list[str]:
        return [bug for bug, checks in self.catches.items() if not checks]

    @property
    def gaps(self) -> list[str]:
        found = [f"the reference fails: {name}" for name in self.reference_failures]
        found += [f"the stub passes: {name}" for name in self.stub_passes]
        found += [f"no check catches the known bug {name}" for name in self.missed_bugs]
        found += [f"no check's hint names the known bug {name}" for name in self.unnamed]
        if len(self.catches) < MIN_BUGS:
            found.append(f"only {len(self.catches)} known bug(s) in the catalog; "
                         f"at least {MIN_BUGS} are expected")
        return found


@dataclass
class Verification:
    exercises: list[ExerciseAudit]
    stale: list[Path]  # generated files that differ from what the build writes
    edited: list[Path] = field(default_factory=list)  # of those, exercise files holding someone's work

    @property
    def passed(self) -> bool:
        out_of_date = set(self.stale) - set(self.edited)  # work in exercises/ is no gap in the checks
        return not out_of_date and not any(audit.gaps for audit in self.exercises)


def verify(seed: int = 0, jobs: int = 1, progress: Callable[[int, int], None] | None = None,
           root: Path = COURSE_ROOT, mode: recorded.Mode | None = None,
           device: torch.device = torch.device("cpu"),
           chapters: tuple[Chapter, ...] = CHAPTERS) -> Verification:
    """Grade the references, the stubs and every known bug; check the build.

    Args:
        seed: seed of the checks' random inputs.
        jobs: processes grading known bugs side by side.
        progress: called with ``(bugs graded, bugs in all)`` as they finish.
        root: the tree whose generated files (stubs, notebooks, figures) are
            checked against the build: a copy, in a test that must not
            touch the course's own ``exercises/``.
        mode: how the reference, the known bugs and the oracles answer
            (``recorded.Mode``); None: live. A test verifies the edition's
            recordings with a ``recorded.Replayer``.
        device: where the student's code runs, as ``grade --device`` says.
        chapters: the chapters to prove (``verify --chapter``), and whose
            generated files to check; every chapter by default.
    """
    if is_student_edition():
        raise GraderError("this is the student edition: it has no reference solutions to verify "
                          "the checks with; run mha-course verify in the instructor's tree")
    audits = {(c.id, e.name): ExerciseAudit(c, e) for c in chapters for e in c.exercises}
    mode = mode if mode is not None else recorded.Live()
    references = grade([(c, c.solution()) for c in chapters], device, seed=seed, mode=mode)
    files = generated_files(root)
    with tempfile.TemporaryDirectory() as folder:
        stubs = [(chapter, path) for chapter, path in write_stubs(files, root, Path(folder)) if chapter in chapters]
        stubs = grade(stubs, device, seed=seed, mode=mode)
    for result in references.exercises:
        audit = audits[result.chapter.id, result.exercise.name]
        audit.checks = [check.check for check in result.checks if check.outcome != "skipped"]
        audit.reference_failures = [check.check for check in result.failed_checks]
    for result in stubs.exercises:
        audit = audits[result.chapter.id, result.exercise.name]
        audit.stub_passes = [check.check for check in result.checks if check.outcome == "passed"]
    tasks = [(chapter.id, index) for chapter in chapters for index in range(len(KNOWN_BUGS[chapter.id]))]
    preload(chapters)  # once here, not once for each known bug
    with forked_pool(jobs) as pool:
        for done, (chapter_id, index, failed, hints) in enumerate(
                pool.map(_grade_bug, tasks, [seed] * len(tasks), [mode] * len(tasks), [device] * len(tasks)),
                start=1):
            bug = KNOWN_BUGS[chapter_id][index]
            audit = audits[chapter_id, bug.exercise]
            audit.catches[bug.name], audit.hints[bug.name] = failed, hints
            if failed and bug.hint not in hints:
                audit.unnamed.append(bug.name)
            if progress:
                progress(done, len(tasks))
    if chapters != CHAPTERS:  # the other chapters' files are not this proof's to judge
        files = {path: text for path, text in files.items() if _of_chapters(path, chapters)}
    return Verification(list(audits.values()), stale_files(files), edited_files(files))


def _of_chapters(path: Path, chapters: tuple[Chapter, ...]) -> bool:
    """A generated file of one of ``chapters``: its stub, notebook, lesson or figure."""
    return any(chapter.module in path.name or chapter.folder in path.parts for chapter in chapters)


def _grade_bug(task: tuple[str, int], seed: int, mode: recorded.Mode,
               device: torch.device) -> tuple[str, int, set[str], set[str]]:
    """Grade the reference with one known bug: the checks of its exercise it
    fails, and the hints those checks gave."""
    chapter_id, index = task
    chapter = find_chapter(chapter_id)
    bug = KNOWN_BUGS[chapter_id][index]
    source = chapter.solution().read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / chapter.file_name
        path.write_text(apply_bug(source, bug), encoding="utf-8")
        report = grade([(chapter, path)], device, seed=seed, only={bug.exercise}, mode=mode)
    (result,) = report.exercises
    failed = result.failed_checks
    return chapter_id, index, {check.check for check in failed}, {check.hint for check in failed if check.hint}
