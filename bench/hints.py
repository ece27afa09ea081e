"""How often a failing answer gets a hint that names its mistake.

Run by hand: ``python bench/hints.py [--seed N] [--jobs N] [--chapters ch01 ...]
[--verbose] [--no-catalog] [--slips N]``. Two sets of mistakes are graded, each edit of the reference
solution on its own, against its exercise's checks only (as ``verify``
grades the known bugs):

* the corpus of mistakes no known bug catalogues (``tests/mistakes/``),
  each with the relation (``grader.relations``) whose hint it should get:
  the share of the caught ones that get it, and the number that get a
  wrong hint instead (a relation that is not theirs, or a known bug's
  hint). An edit of the reference (``grader.edits``) is right where it
  writes the mistake's very definition; one that writes another that gives
  the same answers on every check is counted apart, as "the same answers";
* the known-bug catalog, graded twice, with relations and without them:
  the number of bugs whose checks' hints differ (relations must leave the
  catalog's hints as they were).

With ``--slips N``, a third set instead: N random one-token slips a
chapter (``bench/slips.py``), mistakes nobody wrote down, for the share of
the caught ones that get a hint at all. A mistake's hints are those of its
exercise's failed checks.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grader import relations
from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter, find_chapter
from grader.edits import edits
from grader.grading import grade
from grader.known_bugs import KNOWN_BUGS, apply_bug, function_span
from grader.sandbox import preload
from grader.side_by_side import forked_pool

sys.path.insert(0, str(COURSE_ROOT / "tests"))  # the corpus's package, ``mistakes``
from mistakes import of_chapter as corpus  # noqa: E402 - found once the path above is there
from slips import random_slips  # noqa: E402 - bench/slips.py, beside this file


@dataclass
class Graded:
    """What a grade of one edited file found: whether the exercise failed,
    the relations its failed checks named and the known bugs' hints they gave."""

    chapter: str
    name: str
    caught: bool
    relations: set[str]
    catalog_hints: set[str]
    hints: tuple[str, ...]  # every failed check's hint, in check order


def _grade(task: tuple[str, str, int, bool], seed: int) -> Graded:
    """Grade the reference with one edit (``"corpus"``, ``"catalog"`` or
    ``"slips"``, the chapter, the edit's index, whether relations are on)."""
    kind, chapter_id, index, with_relations = task
    chapter = find_chapter(chapter_id)
    edit = (corpus(chapter_id) if kind == "corpus" else KNOWN_BUGS[chapter_id] if kind == "catalog"
            else random_slips(chapter, _SLIPS, seed))[index]
    relations.ENABLED = with_relations  # this process is a fork of the bench's: its own copy
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / chapter.file_name
        path.write_text(apply_bug(chapter.solution().read_text(encoding="utf-8"), edit), encoding="utf-8")
        report = grade([(chapter, path)], seed=seed, only={edit.exercise})
    (result,) = report.exercises
    failed = result.failed_checks
    named = {name for check in failed if check.relation for name in check.relation.split("+")}
    if relations.EDIT in named:  # judged right only where the named edit is the mistake itself
        slips = {slip for check in failed if check.relation and relations.EDIT in check.relation
                 for slip in check.hint.split("; or ")}
        named.discard(relations.EDIT)
        named.add(relations.EDIT if _written(chapter, edit) in
                  {one.source() for one in edits(chapter, edit.exercise) if str(one.hint) in slips}
                  else "the same answers")
    return Graded(chapter_id, edit.name, bool(failed), named,
                  {check.hint for check in failed if check.hint and not check.relation},
                  tuple(check.hint or "" for check in failed))


def _written(chapter: Chapter, mistake) -> str:
    """The mistake's definition as ``ast.unparse`` writes it (as an edit's ``source`` is)."""
    source = apply_bug(chapter.solution().read_text(encoding="utf-8"), mistake)
    start, end = function_span(source, mistake.exercise)
    return ast.unparse(ast.parse(source[start:end]).body[0])


_SLIPS = 0  # slips a chapter (--slips), set before the pool forks


def _slips(chapters, seed: int, jobs: int, verbose: bool) -> None:
    """Grade ``_SLIPS`` random slips a chapter (``bench/slips.py``) and print
    how many of those caught get a hint, and how many the very edit."""
    tasks = [("slips", chapter.id, index, True) for chapter in chapters
             for index in range(len(random_slips(chapter, _SLIPS, seed)))]
    preload(chapters)
    with forked_pool(jobs) as pool:
        graded = list(pool.map(_grade, tasks, [seed] * len(tasks)))
    kinds: dict[str, list[int]] = {}
    for (_, chapter_id, index, _), result in zip(tasks, graded):
        slip = random_slips(find_chapter(chapter_id), _SLIPS, seed)[index]
        hinted = bool(result.relations or result.catalog_hints)
        counts = kinds.setdefault(slip.why, [0, 0, 0])
        counts[0] += result.caught
        counts[1] += result.caught and hinted
        counts[2] += result.caught and relations.EDIT in result.relations
        if verbose:
            named = ", ".join(sorted(result.relations | ({"known bug"} if result.catalog_hints else set()))) or "-"
            print(f"{chapter_id} {slip.exercise:30s} {slip.why:8s} {'caught' if result.caught else 'missed':6s} "
                  f"{named:24s} {slip.old.strip()!r} -> {slip.new.strip()!r}")
    caught, hinted, exact = (sum(counts[at] for counts in kinds.values()) for at in range(3))
    print(f"slips (seed {seed}): {len(tasks)} made, {caught} caught, a hint for {hinted} "
          f"({hinted / max(caught, 1):.0%} of those caught), the very edit named for {exact}")
    for kind, (one, two, three) in sorted(kinds.items()):
        print(f"  {kind:8s} {one:4d} caught, a hint for {two:4d}, the very edit for {three:4d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--chapters", nargs="*", default=[chapter.id for chapter in CHAPTERS])
    parser.add_argument("--verbose", action="store_true", help="a line for every mistake")
    parser.add_argument("--no-catalog", action="store_true", help="grade the corpus only")
    parser.add_argument("--slips", type=int, default=0, metavar="N",
                        help="grade N random slips of each chapter's solution instead (bench/slips.py)")
    options = parser.parse_args()
    chapters = [find_chapter(chapter_id) for chapter_id in options.chapters]
    if options.slips:
        global _SLIPS
        _SLIPS = options.slips
        _slips(chapters, options.seed, options.jobs, options.verbose)
        return
    mistakes = {(chapter.id, index): mistake
                for chapter in chapters for index, mistake in enumerate(corpus(chapter.id))}
    tasks = [("corpus", chapter_id, index, True) for chapter_id, index in mistakes]
    if not options.no_catalog:
        tasks += [("catalog", chapter.id, index, on) for chapter in chapters
                  for index in range(len(KNOWN_BUGS[chapter.id])) for on in (True, False)]
    preload(chapters)
    with forked_pool(options.jobs) as pool:
        graded = list(pool.map(_grade, tasks, [options.seed] * len(tasks)))
    found = dict(zip(tasks, graded))

    caught = right = same = wrong = 0
    for (chapter_id, index), mistake in mistakes.items():
        result = found["corpus", chapter_id, index, True]
        if not result.caught:
            verdict = "not caught"
        elif result.relations & {*mistake.relations, relations.EDIT}:
            verdict, right = "right", right + 1
        elif result.relations == {"the same answers"}:
            verdict, same = "same answers", same + 1
        elif result.relations or result.catalog_hints:
            verdict, wrong = "WRONG", wrong + 1
        else:
            verdict = "no hint" if mistake.relations else "no hint (none expected)"
        caught += result.caught
        if options.verbose or verdict == "WRONG":
            named = ", ".join(sorted(result.relations)) or "-"
            print(f"{chapter_id} {mistake.exercise:30s} {mistake.name:32s} {verdict:12s} "
                  f"expected {'/'.join(mistake.relations) or '-'}, named {named}"
                  + (f"; known bug's hint: {sorted(result.catalog_hints)}" if result.catalog_hints else ""))
    share = f"{right / caught:.0%}" if caught else "-"
    print(f"corpus (seed {options.seed}): {len(mistakes)} mistakes, {caught} caught, "
          f"a right hint for {right} ({share} of those caught), an edit with the same answers for {same}, "
          f"a wrong hint for {wrong}")
    if options.no_catalog:
        return
    changed = []
    for chapter in chapters:
        for index, bug in enumerate(KNOWN_BUGS[chapter.id]):
            on, off = found["catalog", chapter.id, index, True], found["catalog", chapter.id, index, False]
            if on.hints != off.hints:
                changed.append(f"{chapter.id} {bug.exercise}/{bug.name}: {off.hints} -> {on.hints}")
    print(f"catalog (seed {options.seed}): {sum(len(KNOWN_BUGS[c.id]) for c in chapters)} known bugs, "
          f"hints changed by relations for {len(changed)}")
    for line in changed:
        print("  " + line)


if __name__ == "__main__":
    main()
