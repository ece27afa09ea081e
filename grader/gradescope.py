"""Gradescope: build the autograder bundle, and grade one submission inside it.

Gradescope's autograder specification
(https://gradescope-autograders.readthedocs.io/en/latest/specs/) asks for a
zip with two files at its root: ``setup.sh``, run once as root when
Gradescope builds the assignment's Ubuntu image, and ``run_autograder``, run
for every submission. The zip is unpacked into ``/autograder/source``, the
student's files arrive in ``/autograder/submission``, and whatever
``/autograder/results/results.json`` holds when ``run_autograder`` ends is the
grade. Gradescope keeps ``run_autograder``'s output in
``/autograder/results/stdout`` for instructors; students see only what the
JSON's ``output`` fields say.

``write_bundle`` writes that zip: the two scripts (from ``grader/templates/``) and
the course source the grader needs at run time (pyproject.toml, README.md,
``grader/`` with its checks and known bugs, ``solutions/``). Lessons,
exercises, notebooks and the project's tests are left out: grading reads
none of them (a submitted notebook is read with nbformat alone).

``main`` (``python -m grader.gradescope ROOT``) is what ``run_autograder``
calls. It finds the chapter files in ``ROOT/submission`` (``finding.find_chapters``,
the rule ``mha-course batch`` and ``grade --dir`` follow too), grades them
as every hosted platform does (``hosted.grade_folder``: the sandbox, the
unprivileged account ``setup.sh`` creates, which Gradescope's best practices
ask for, and why the submission cannot forge its verdict), and writes
``ROOT/results/results.json``, always: an empty or unreadable submission
still gets a results.json that says what was expected, and its output names
the file graded for each chapter and why that one. If this process dies
anyway, ``run_autograder`` replaces results.json with a score of 0 that says so.

Run outside Gradescope (``AUTOGRADER_ROOT=folder bash folder/source/run_autograder``),
the bundle needs what ``setup.sh`` installs: run setup.sh first (as root; it
makes the virtual environment in ``VENV``), or point ``MHA_COURSE_PYTHON`` at
a Python where the course is installed. Without either, ``run_autograder``
falls back to ``python3``, and when that lacks torch results.json says so in
one line (score 0), not with a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import traceback
import zipfile
from collections.abc import Sequence
from pathlib import Path

from grader import reaping
from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter, find_chapter, gradescope_test_name
from grader.finding import Found
from grader.hosted import SECRETS, STUDENT_USER, filled, grade_folder, missing_solutions, write_results

VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")  # Gradescope's values
VENV = "/opt/mha-course/venv"  # where setup.sh installs the course and torch

SCRIPTS = ("setup.sh", "run_autograder")  # templates in hosted.TEMPLATES


# -- the bundle -------------------------------------------------------------------


class BundleError(Exception):
    """The bundle cannot be built from this tree."""


def bundle_sources(root: Path = COURSE_ROOT) -> list[str]:
    """The course files the autograder needs, relative to ``root``, sorted.

    pyproject.toml and README.md (the package's readme) let setup.sh install
    the course; ``grader/`` is the autograder (its ``.py`` files and the
    checks' pytest.ini: caches and editor leftovers stay out); ``solutions/``
    holds the references the checks compare with; a chapter's ``.txt`` files
    are data its checks read (the capstone's training text).
    """
    names = ["pyproject.toml", "README.md"]
    for path in (root / "grader").rglob("*"):
        if path.is_file() and path.suffix in (".py", ".ini") and "__pycache__" not in path.parts:
            names.append(path.relative_to(root).as_posix())
    names += [path.relative_to(root).as_posix() for path in (root / "solutions").glob("*.py")]
    names += [path.relative_to(root).as_posix() for path in (root / "chapters").glob("*/*.txt")]
    return sorted(names)


def bundle_scripts(chapters: tuple[Chapter, ...] | list[Chapter] = CHAPTERS,
                   visibility: str = "visible", timeout: float = 10.0) -> dict[str, str]:
    """``{"setup.sh": text, "run_autograder": text}`` with this bundle's settings."""
    if visibility not in VISIBILITIES:
        raise ValueError(f"visibility must be one of {', '.join(VISIBILITIES)}, not {visibility!r}")
    values = {
        "@CHAPTERS@": " ".join(chapter.id for chapter in chapters),
        "@VISIBILITY@": visibility,
        "@TIMEOUT@": f"{timeout:g}",
        "@STUDENT_USER@": STUDENT_USER,
        "@VENV@": VENV,
        "@SECRETS@": " ".join(SECRETS),
    }
    return {name: filled(name, values) for name in SCRIPTS}


def write_bundle(out: Path, chapters: tuple[Chapter, ...] | list[Chapter] = CHAPTERS,
                 visibility: str = "visible", timeout: float = 10.0,
                 root: Path = COURSE_ROOT) -> list[str]:
    """Write the autograder zip to ``out``; return the names it holds.

    The zip is the same, byte for byte, for the same sources and settings:
    entries sorted, every date set to 1980-01-01 (zip's epoch), modes fixed
    (0755 for the scripts, which Gradescope runs, 0644 for the rest). It is
    written next to ``out`` and renamed into place, so a failed build never
    leaves half a zip.

    Raises:
        BundleError: ``root`` lacks a chapter's reference solution.
        OSError: ``out`` cannot be written.
    """
    missing = missing_solutions(chapters, root)
    if missing:
        raise BundleError(f"no {', '.join(missing)}: the autograder grades against the reference "
                          "solutions, so build it from the instructor's tree")
    entries = {name: script.encode() for name, script in
               bundle_scripts(chapters, visibility, timeout).items()}
    for name in bundle_sources(root):
        entries[name] = (root / name).read_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as bundle:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # Unix, so that unzip applies the modes below
            mode = 0o755 if name in ("setup.sh", "run_autograder") else 0o644
            info.external_attr = (0o100000 | mode) << 16  # a regular file with that mode
            bundle.writestr(info, entries[name])
    out = Path(out)
    handle, temporary = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(buffer.getvalue())
        os.chmod(temporary, 0o644)
        os.replace(temporary, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return sorted(entries)


# -- results.json ---------------------------------------------------------------------


def expected_files(chapters) -> str:
    names = ", ".join(chapter.file_name for chapter in chapters)
    return (f"Expected one file per chapter, named like the course's exercises: {names} "
            "(or the same names ending in .ipynb, for notebooks), at the top of the "
            "submission or in a folder of it; a zip of them works too.")


def missing_reason(chapter: Chapter) -> str:
    """Why a chapter's exercises score 0 when the submission has no file for it."""
    return (f"no file for {chapter.id} in the submission "
            f"(expected {chapter.module}.py or {chapter.module}.ipynb)")


def with_missing_chapters(results: dict, chapters: Sequence[Chapter],
                          reasons: dict[str, str] | None = None) -> dict:
    """``results`` (a results.json of the chapters graded, as
    ``report.results_json`` writes it) with a test for every exercise of
    ``chapters``: each one it lacks at 0 points, whose output is its
    chapter's reason in ``reasons`` (by chapter id; by default
    ``missing_reason``). ``score`` and ``max_score`` are summed over all, so
    the maximum is the assignment's whatever was submitted.

    The one place where missing chapters become 0-point tests, for the
    Gradescope autograder and for ``mha-course batch`` alike. It needs
    neither torch nor the grader: a submission with nothing to grade gets
    its answer even where those fail to load.
    """
    reasons = reasons or {}
    graded = {test["name"]: test for test in results.get("tests", [])}
    tests = []
    for chapter in chapters:
        reason = reasons.get(chapter.id) or missing_reason(chapter)
        for exercise in chapter.exercises:
            name = gradescope_test_name(chapter, exercise)
            tests.append(graded.get(name) or {"name": name, "score": 0, "max_score": exercise.points,
                                              "status": "failed", "output": reason, "visibility": "visible"})
    return {**results, "score": sum(test["score"] for test in tests),
            "max_score": sum(test["max_score"] for test in tests), "tests": tests}


def gradescope_results(found: Found, chapters, report, visibility: str, seed: int, seconds: float) -> dict:
    """Gradescope's results.json: every exercise of the assignment's chapters,
    the ones with no file at 0 points saying so, and an ``output`` on top
    that says which file was graded for each chapter and why.

    Graded exercises are reported as ``mha-course grade --json`` reports
    them (``report.sources`` naming the files); the rest needs neither
    torch nor the grader (``with_missing_chapters``).
    """
    graded = {"tests": []}
    if report is not None:
        from grader.report import results_json

        graded = results_json(report)
    results = with_missing_chapters(graded, chapters)
    lines = []
    if graded.get("output"):  # "ch01: graded FILE (why)", then the notes of grading
        lines.append(graded["output"])
    if found.chosen:
        missing = [chapter.id for chapter in chapters if chapter.id not in found.chosen]
        if missing:
            lines.append(f"No file for {', '.join(missing)}: those exercises score 0.")
    else:
        lines.append("No exercise file was found in the submission, so nothing was graded.")
        lines.append(expected_files(chapters))
    lines += [f"Ignored {line}." for line in found.ignored]
    lines.append(f"Random inputs: seed {seed}.")
    results["output"] = "\n".join(lines)
    results["execution_time"] = round(seconds, 3)
    # The grader's log on stdout is for instructors (Gradescope keeps it in
    # results/stdout); students read the output fields above.
    results["stdout_visibility"] = "hidden"
    results["visibility"] = visibility
    for test in results["tests"]:
        test["visibility"] = visibility
    results["extra_data"] = {
        "seed": seed,
        "files": {chapter_id: found.shown(path) for chapter_id, path in found.chosen.items()},
    }
    return results


def grade_submission(root: Path, chapters, visibility: str = "visible", timeout: float = 10.0,
                     student_user: str = STUDENT_USER, log=print) -> dict:
    """Grade ``root/submission`` and write ``root/results/results.json``;
    returns what was written."""
    graded = grade_folder(root / "submission", chapters, timeout, student_user, log)
    results = gradescope_results(graded.found, chapters, graded.report, visibility, graded.seed, graded.seconds)
    write_results(root / "results" / "results.json", results)  # last: no student code runs after this
    return results


def _failure_results(error: BaseException) -> dict:
    """The results.json when grading raised. A module missing means the
    bundle runs where setup.sh did not (a local try of run_autograder): one
    line says what is missing and how to run it, as no traceback would."""
    if isinstance(error, ModuleNotFoundError):
        output = (f"The autograder cannot grade here: its Python ({sys.executable}) lacks "
                  f"{error.name or 'a module it needs'}, which setup.sh installs. Run setup.sh first "
                  f"(as root; it makes {VENV}), or set MHA_COURSE_PYTHON to a Python where the course "
                  "is installed. This is not a verdict on your code.")
    else:
        output = ("The autograder failed while grading this submission "
                  f"({type(error).__name__}). This is not a verdict on your code: "
                  "please tell your instructor, who has the details.")
    return {"score": 0, "output": output, "stdout_visibility": "hidden", "tests": []}


def main(argv: list[str] | None = None) -> int:
    """``python -m grader.gradescope ROOT``: what ``run_autograder`` runs.

    Exits 0 once results.json is written, whatever the grade; 1 only when
    not even an error's results.json could be written.
    """
    parser = argparse.ArgumentParser(prog="python -m grader.gradescope",
                                     description="Grade ROOT/submission into ROOT/results/results.json.")
    parser.add_argument("root", type=Path, help="Gradescope's folder (/autograder)")
    parser.add_argument("--chapters", default="", help="chapter ids, space-separated (default: all)")
    parser.add_argument("--visibility", choices=VISIBILITIES, default="visible")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds of CPU time for one check")
    parser.add_argument("--student-user", default=STUDENT_USER)
    args = parser.parse_args(argv)
    reaping.adopt_orphans()  # first, before anything forks
    results_path = args.root / "results" / "results.json"
    try:
        chapters = [find_chapter(name) for name in args.chapters.split()] or list(CHAPTERS)
        print(f"mha-course grader from {Path(__file__).resolve().parent}", flush=True)
        results = grade_submission(args.root, chapters, args.visibility, args.timeout,
                                   args.student_user, log=lambda line: print(line, flush=True))
    except BaseException as error:  # noqa: BLE001 - Gradescope must get a results.json
        results = _failure_results(error)
        if isinstance(error, ModuleNotFoundError):  # not installed here: what to do, not a traceback
            print(results["output"], flush=True)
        else:
            traceback.print_exc()
        reaping.stop_descendants()
        try:
            write_results(results_path, results)
        except OSError:
            traceback.print_exc()
            return 1
        return 0
    files = ", ".join(f"{chapter} <- {name}" for chapter, name in results["extra_data"]["files"].items())
    print(f"score {results['score']} / {results['max_score']} ({files or 'no files'}); "
          f"seed {results['extra_data']['seed']}; {results['execution_time']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
