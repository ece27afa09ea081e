"""PrairieLearn: the files a course needs to grade with PrairieLearn's
external grader, and the grade of one submission inside it.

PrairieLearn's external grading
(https://prairielearn.readthedocs.io/en/latest/externalGrading/) runs a
Docker image for each submission, on a fleet of grader hosts (one job a
container: 2 GiB, 0.9 of a core, no network, by default). It copies in the
question's files and the student's:

- ``/grade/serverFilesCourse/``: the folders the question's
  ``externalGradingOptions.serverFilesCourse`` names, from the course's own
  (private) repository;
- ``/grade/student/``: the files the student uploaded;
- ``/grade/data/data.json``: the question's data (not read here);

then runs the entry point, as the image's user (root: the image sets no
other), and reads ``/grade/results/results.json``, which must be at most
1 MiB, with an exit status of 0. The file's contract: ``score`` in [0, 1],
``gradable`` (False: the submission could not be graded, the student keeps
the attempt, and ``format_errors`` says why), ``message`` and ``output``
for the whole, and ``tests``, each with ``name``, ``points``,
``max_points``, ``message`` and ``output`` (PrairieLearn shows the points
of every test only when every test has both).

``write_course`` writes what a course adds to its PrairieLearn repository
(``mha-course prairielearn OUT``):

- ``image/``: a Dockerfile and its requirements: Python, the CPU build of
  torch, the grader's libraries and the account student code runs as.
  PrairieLearn pulls images from Docker Hub, where they are public, so the
  image holds none of the course's secrets: no checks, known bugs or
  reference solutions;
- ``serverFilesCourse/mha-course/``: the grader with its checks and the
  reference solutions (what the Gradescope bundle holds), and its entry
  point ``run``; these reach only the grading container, for each job;
- ``questions/mha-course/chNN_topic/``: one question a chapter, its
  ``info.json`` pointing at the image and the entry point, its
  ``question.html`` taking the chapter's file;
- ``README.md``: how to deploy them.

``main`` (``python -m grader.prairielearn ROOT``) is what ``run`` calls. It
grades the chapter files in ``ROOT/student`` as Gradescope's autograder
does (``hosted.grade_folder``: the same sandbox, the same unprivileged
account, the same verdicts and messages as ``mha-course grade --json``) and
writes ``ROOT/results/results.json`` last, always. A submission with no
chapter file, or a file the grader cannot read (not UTF-8, a notebook that
is not JSON), is not gradable: the student keeps the attempt and is told
what was expected.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import shutil
import sys
import tempfile
import traceback
import uuid
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from grader import reaping
from grader.catalog import CHAPTERS, COURSE_ROOT, Chapter, find_chapter
from grader.gradescope import BundleError, bundle_sources, expected_files, gradescope_results
from grader.hosted import SECRETS, STUDENT_USER, filled, grade_folder, missing_solutions, write_results

IMAGE = "mha-course/grader"  # the Docker Hub name the questions use unless told another
COURSE = "mha-course"  # the course's folder in serverFilesCourse/ and in questions/
ENTRY = "run"  # the entry point, in that folder
MAX_RESULTS_BYTES = 2**20  # PrairieLearn rejects a larger results.json
MAX_JOB_SECONDS = 600  # PrairieLearn's cap on a question's timeout
# The questions' ids, stable across exports: the same chapter keeps its
# question (and its students' grades) when the course is exported again.
UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/mha-course/prairielearn")
RUN_TEMPLATE = "run_prairielearn"  # templates in hosted.TEMPLATES
DOCKERFILE_TEMPLATE = "prairielearn.Dockerfile"


# -- the course's files -------------------------------------------------------------------


def job_seconds(chapter: Chapter, timeout: float) -> int:
    """The question's timeout: the longest a grade of ``chapter`` can take
    when every check runs to its limit (``batch.student_seconds``), within
    PrairieLearn's cap. A grade of correct code takes a few seconds."""
    from grader.batch import GradingOptions, student_seconds

    return min(MAX_JOB_SECONDS, math.ceil(student_seconds(GradingOptions(0, timeout, (chapter,)))))


def entry_point(chapter: Chapter, timeout: float) -> list[str]:
    """The question's entry point, with its arguments: which chapter, and
    each check's limit."""
    return [f"/grade/serverFilesCourse/{COURSE}/{ENTRY}", "--chapters", chapter.id, "--timeout", f"{timeout:g}"]


def question_info(chapter: Chapter, image: str, timeout: float) -> dict:
    """A chapter's question ``info.json``."""
    return {
        "uuid": str(uuid.uuid5(UUID_NAMESPACE, chapter.id)),
        "title": f"{chapter.id}: {chapter.title}",
        "topic": "Attention",
        "tags": [COURSE, chapter.id],
        "type": "v3",
        "singleVariant": True,  # the inputs change with every grade, not with the variant
        "gradingMethod": "External",
        "externalGradingOptions": {
            "image": image,
            "entrypoint": entry_point(chapter, timeout),
            "serverFilesCourse": [f"{COURSE}/"],
            "timeout": job_seconds(chapter, timeout),
        },
    }


def question_html(chapter: Chapter) -> str:
    """A chapter's ``question.html``: what to upload, the exercises and
    their points, and where the results show."""
    exercises = "\n".join(
        f"    <li><code>{html.escape(exercise.name)}</code>: {html.escape(exercise.summary)} "
        f"({exercise.points} point{'s' if exercise.points != 1 else ''}{', optional' if exercise.optional else ''})</li>"
        for exercise in chapter.exercises)
    return f"""<pl-question-panel>
  <p>
    Chapter {chapter.number}: <strong>{html.escape(chapter.title)}</strong>.
    Upload your <code>{chapter.module}.py</code>, or your notebook
    <code>{chapter.module}.ipynb</code>. The autograder runs the chapter's
    hidden checks on it, with fresh random inputs each time:
  </p>
  <ul>
{exercises}
  </ul>
  <p>
    Try it first on your own machine: <code>mha-course grade {chapter.id}</code>.
  </p>
  <pl-file-upload optional-file-names="{chapter.module}.py, {chapter.module}.ipynb"></pl-file-upload>
</pl-question-panel>

<pl-submission-panel>
  <pl-external-grader-results></pl-external-grader-results>
  <pl-file-preview></pl-file-preview>
</pl-submission-panel>
"""


def requirements() -> str:
    """The grader's libraries, for the image: the course's dependencies but
    torch, which the Dockerfile installs first (the CPU build), as the
    installed course declares them."""
    try:
        declared = metadata.requires("mha-course") or []
    except metadata.PackageNotFoundError:
        raise BundleError("the course is not installed here (pip install -e .): its dependencies "
                          "come from the installed package") from None
    names = [line.split(";")[0].strip() for line in declared if "extra ==" not in line]
    return "".join(f"{name}\n" for name in sorted(names) if not name.startswith("torch"))


def torch_version() -> str:
    """The torch the image installs: the one installed here, which graded
    the reference (a local build's ``+cpu`` left off)."""
    import torch

    return torch.__version__.split("+")[0]


def course_files(chapters: Sequence[Chapter] = CHAPTERS, image: str = IMAGE, timeout: float = 10.0,
                 root: Path = COURSE_ROOT) -> dict[str, bytes]:
    """Every file ``write_course`` writes, by its path in OUT.

    Raises:
        BundleError: ``root`` lacks a chapter's reference solution, or the
            course is not installed.
    """
    missing = missing_solutions(chapters, root)
    if missing:
        raise BundleError(f"no {', '.join(missing)}: the grader grades against the reference "
                          "solutions, so export the course from the instructor's tree")
    values = {"@IMAGE@": image, "@TORCH@": torch_version(), "@STUDENT_USER@": STUDENT_USER,
              "@SECRETS@": " ".join(SECRETS), "@COURSE@": COURSE}
    files = {
        "image/Dockerfile": filled(DOCKERFILE_TEMPLATE, values).encode(),
        "image/requirements.txt": requirements().encode(),
        f"serverFilesCourse/{COURSE}/{ENTRY}": filled(RUN_TEMPLATE, values).encode(),
        "README.md": deployment_readme(chapters, image, timeout).encode(),
    }
    for name in bundle_sources(root):
        files[f"serverFilesCourse/{COURSE}/{name}"] = (root / name).read_bytes()
    for chapter in chapters:
        folder = f"questions/{COURSE}/{chapter.module}"
        files[f"{folder}/info.json"] = (json.dumps(question_info(chapter, image, timeout), indent=2) + "\n").encode()
        files[f"{folder}/question.html"] = question_html(chapter).encode()
    return files


def deployment_readme(chapters: Sequence[Chapter], image: str, timeout: float) -> str:
    """OUT/README.md: what each folder is, and the steps to grade with it."""
    rows = "\n".join(f'        {{"id": "{COURSE}/{chapter.module}", "autoPoints": {chapter.points}}},'
                     for chapter in chapters).rstrip(",")
    return f"""# mha-course on PrairieLearn

Written by `mha-course prairielearn`: one externally graded question a
chapter ({', '.join(chapter.id for chapter in chapters)}), each check limited to
{timeout:g} s of CPU time.

- `image/`: the grading image's Dockerfile. It holds Python, the CPU build of
  torch, the grader's libraries and the account `{STUDENT_USER}` that student
  code runs as; none of the course. Build it and push it to Docker Hub, where
  PrairieLearn pulls images from:

      docker build -t {image} image/
      docker push {image}

  Pushed under another name? Export again with `--image NAME`.
- `serverFilesCourse/{COURSE}/`: the grader, its hidden checks and the reference
  solutions. Copy it into your course repository's `serverFilesCourse/`. It
  must stay private: PrairieLearn copies it into the grading container only.
- `questions/{COURSE}/`: the questions. Copy them into your course repository's
  `questions/`, then list them in an assessment's `infoAssessment.json`, with
  the chapter's points (the grader's score is a fraction of them):

      "zones": [{{"questions": [
{rows}
      ]}}]

Each job grades the uploaded file in `/grade/student` with the grader's
sandbox (Landlock, seccomp and rlimits in every worker, student code run as
`{STUDENT_USER}`, the checks and the solutions unreadable to it), which the
container adds to. The job's log names what this host's kernel lacks. A
submission with no file of the chapter, or with one the grader cannot read,
is "not gradable": the student keeps the attempt and is told why.
"""


def write_course(out: Path, chapters: Sequence[Chapter] = CHAPTERS, image: str = IMAGE,
                 timeout: float = 10.0, root: Path = COURSE_ROOT) -> list[str]:
    """Write the course's PrairieLearn files into ``out``, a new or empty
    folder; return their paths in it, sorted.

    The files are written into a folder beside ``out`` and renamed into place,
    so a failed export leaves nothing half written. The entry point is
    executable (0755), the rest 0644.

    Raises:
        BundleError: as ``course_files``.
        OSError: ``out`` cannot be written.
    """
    files = course_files(chapters, image, timeout, root)
    out = Path(out)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        for name, content in files.items():
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            path.chmod(0o755 if name.endswith(f"/{ENTRY}") else 0o644)
        staging.chmod(0o755)
        if out.is_dir():
            out.rmdir()  # empty (the command checks): replaced by the export
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(files)


# -- one job: /grade/student to /grade/results/results.json --------------------------------


def unreadable(found, chapters: Sequence[Chapter]) -> list[str]:
    """Why each chosen file the grader cannot read at all cannot be graded:
    ``["ch02: ch02_cross_attention.ipynb: ..."]``."""
    from grader.loading import SubmissionError, load_submission

    reasons = []
    for chapter in chapters:
        if chapter.id in found.chosen:
            path = found.chosen[chapter.id]
            try:
                load_submission(path, chapter.module)
            except SubmissionError as error:
                reasons.append(f"{chapter.id}: {found.shown(path)}: {error}")
    return reasons


def not_gradable(errors: list[str], message: str) -> dict:
    """The results of a submission that could not be graded: the student
    keeps the attempt; ``errors`` say why."""
    return {"gradable": False, "format_errors": errors, "message": message, "output": "\n".join(errors)}


def prairielearn_results(graded: dict, seed: int) -> dict:
    """PrairieLearn's results from Gradescope's (``gradescope_results``, the
    schema of ``mha-course grade --json``): the same tests, verdicts and
    messages, each test's first line (the verdict's reason) as its
    ``message`` and the failed checks below it as its ``output``; ``score``
    the fraction of the points."""
    tests = []
    for test in graded["tests"]:
        reason, _, checks = test["output"].partition("\n")
        tests.append({"name": test["name"], "points": test["score"], "max_points": test["max_score"],
                      "message": reason, "output": checks})
    points, maximum = graded["score"], graded["max_score"]
    return fit({
        "gradable": True,
        "score": points / maximum if maximum else 0.0,
        "message": f"{points} / {maximum} points.",
        "output": graded.get("output", ""),
        "tests": tests,
        "seed": seed,
        "execution_time": graded.get("execution_time", 0.0),
    })


def fit(results: dict, limit: int = MAX_RESULTS_BYTES) -> dict:
    """``results``, its longest test outputs cut until the JSON (as
    ``write_results`` writes it) is within ``limit`` bytes, each cut saying
    so: PrairieLearn fails a larger file, grade and all."""
    def size() -> int:
        return len(json.dumps(results, indent=2).encode()) + 1

    excess = size() - limit
    while excess > 0:
        test = max(results.get("tests", []), key=lambda test: len(test["output"]), default=None)
        if test is None or len(test["output"]) < 200:
            raise ValueError("results too large even with every test's output cut")
        keep = max(0, len(test["output"]) - excess - 100)
        cut = len(test["output"]) - keep
        test["output"] = test["output"][:keep] + f"\n[... {cut} characters cut: the results must fit in 1 MiB]"
        excess = size() - limit
    return results


def grade_job(root: Path, chapters: Sequence[Chapter], timeout: float = 10.0,
              student_user: str = STUDENT_USER, seed: int | None = None, log=print) -> dict:
    """Grade ``root/student`` and write ``root/results/results.json``; returns
    what was written."""
    from grader.finding import Found, find_chapters

    student = root / "student"
    found = find_chapters(student, chapters) if student.is_dir() else Found()
    if not found.chosen:
        results = not_gradable([f"No file of {', '.join(chapter.id for chapter in chapters)} was uploaded. "
                                + expected_files(chapters)], "Nothing was graded: upload your file.")
    elif problems := unreadable(found, chapters):
        results = not_gradable(problems, "Nothing was graded: the grader cannot read your file.")
    else:
        graded = grade_folder(student, chapters, timeout, student_user, log, seed, found)
        gradescope = gradescope_results(graded.found, chapters, graded.report, "visible", graded.seed,
                                        graded.seconds)
        results = prairielearn_results(gradescope, graded.seed)
    write_results(root / "results" / "results.json", results)  # last: no student code runs after this
    return results


def _failure_results(error: BaseException) -> dict:
    """The results when grading raised: not gradable, so the student keeps the
    attempt; the job's log has the traceback."""
    return not_gradable([f"The autograder failed ({type(error).__name__}). This is not a verdict on "
                         "your code: please tell your instructor, who has the details in the job's log."],
                        "Nothing was graded: the autograder failed.")


def main(argv: list[str] | None = None) -> int:
    """``python -m grader.prairielearn ROOT``: what the entry point runs.

    Exits 0 once results.json is written, whatever the grade (PrairieLearn
    fails a job that exits otherwise); 1 only when not even an error's
    results.json could be written.
    """
    parser = argparse.ArgumentParser(prog="python -m grader.prairielearn",
                                     description="Grade ROOT/student into ROOT/results/results.json.")
    parser.add_argument("root", type=Path, help="PrairieLearn's folder (/grade)")
    parser.add_argument("--chapters", default="", help="chapter ids, space-separated (default: all)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds of CPU time for one check")
    parser.add_argument("--student-user", default=STUDENT_USER)
    parser.add_argument("--seed", type=int, default=None, help="seed of the random inputs (default: a fresh one)")
    args = parser.parse_args(argv)
    reaping.adopt_orphans()  # first, before anything forks
    results_path = args.root / "results" / "results.json"
    try:
        chapters = [find_chapter(name) for name in args.chapters.split()] or list(CHAPTERS)
        print(f"mha-course grader from {Path(__file__).resolve().parent}", flush=True)
        results = grade_job(args.root, chapters, args.timeout, args.student_user, args.seed,
                            log=lambda line: print(line, flush=True))
    except BaseException:  # noqa: BLE001 - PrairieLearn must get a results.json
        error = sys.exc_info()[1]
        traceback.print_exc()
        reaping.stop_descendants()
        try:
            write_results(results_path, _failure_results(error))
        except OSError:
            traceback.print_exc()
            return 1
        return 0
    if results["gradable"]:
        print(f"score {results['score']:.4f} ({results['message']}); seed {results['seed']}", flush=True)
    else:
        print(f"not gradable: {'; '.join(results['format_errors'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
