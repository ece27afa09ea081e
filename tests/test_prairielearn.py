"""PrairieLearn's external grader: the files `mha-course prairielearn` writes,
and the entry point run against folders laid out like PrairieLearn's /grade.

Each job runs the question's own entry point (its info.json's, with /grade
replaced by the test's folder) with bash, as PrairieLearn's grader host runs
it in the container, and its results.json is held to PrairieLearn's
contract (RESULTS_CONTRACT, below) and to `mha-course grade --json` at the
same seed. The image is not built here (that needs Docker Hub): the course
is already installed in this Python, which the entry point is pointed at
(MHA_COURSE_PYTHON), and it grades with the grader copied from
serverFilesCourse/.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from conftest import NO_SUCH_CHAPTER, forging, replace_function
from grader.catalog import CHAPTERS, COURSE_ROOT, find_chapter
from grader.gradescope import bundle_sources
from grader.hosted import STUDENT_USER
from grader.prairielearn import MAX_JOB_SECONDS, MAX_RESULTS_BYTES, fit, write_course

CH01, CH02, CH03 = find_chapter("ch01"), find_chapter("ch02"), find_chapter("ch03")
SOLUTION = CH01.solution().read_text(encoding="utf-8")

# PrairieLearn's contract for results.json, as its documentation
# (externalGrading.md) and its grader host state it: `score` a number in
# [0, 1] when the submission is gradable; `gradable` false with
# `format_errors` (a string or strings) when it is not; every test with both
# `points` and `max_points`, or the per-test points are not shown; the file
# at most 1 MiB (checked apart).
RESULTS_CONTRACT = {
    "type": "object",
    "properties": {
        "gradable": {"type": "boolean"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "format_errors": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "message": {"type": "string"},
        "output": {"type": "string"},
        "tests": {"type": "array", "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                           "points": {"type": "number", "minimum": 0},
                           "max_points": {"type": "number", "minimum": 0},
                           "message": {"type": "string"}, "output": {"type": "string"}},
            "required": ["name", "points", "max_points"],
        }},
    },
    "oneOf": [
        {"properties": {"gradable": {"const": True}}, "required": ["score"]},
        {"properties": {"gradable": {"const": False}}, "required": ["gradable", "format_errors"]},
    ],
}

# What PrairieLearn accepts in a question's info.json (its infoQuestion
# schema), for the keys an externally graded question uses.
QUESTION_CONTRACT = {
    "type": "object",
    "required": ["uuid", "type", "title", "topic"],
    "properties": {
        "uuid": {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
        "type": {"const": "v3"},
        "title": {"type": "string"}, "topic": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "singleVariant": {"type": "boolean"},
        "gradingMethod": {"const": "External"},
        "externalGradingOptions": {
            "type": "object", "required": ["image"], "additionalProperties": False,
            "properties": {
                "image": {"type": "string"},
                "entrypoint": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
                "serverFilesCourse": {"type": "array", "items": {"type": "string"}},
                "timeout": {"type": "integer", "minimum": 1, "maximum": MAX_JOB_SECONDS},
                "enableNetworking": {"type": "boolean"},
                "environment": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
    },
}


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prairielearn") / "out"
    write_course(out)
    return out


def info(course: Path, chapter) -> dict:
    return json.loads((course / "questions" / "mha-course" / chapter.module / "info.json").read_text())


def grade_root(course: Path, folder: Path) -> Path:
    """``folder`` laid out like PrairieLearn's /grade for a job: the course's
    serverFilesCourse/ folder, the student's files, the question's data."""
    shutil.copytree(course / "serverFilesCourse", folder / "serverFilesCourse")
    for name in ("student", "tests", "data"):
        (folder / name).mkdir()
    (folder / "data" / "data.json").write_text(json.dumps({"params": {}, "submitted_answers": {}}))
    return folder


def run_job(course: Path, root: Path, chapter, env: dict | None = None,
            chapters: str | None = None) -> subprocess.CompletedProcess:
    """Run the question's entry point as PrairieLearn does, ``/grade`` being
    ``root``; ``chapters``: another value of its ``--chapters``, as a question
    of several chapters would have."""
    entry = [part.replace("/grade", str(root), 1) if part.startswith("/grade/") else part
             for part in info(course, chapter)["externalGradingOptions"]["entrypoint"]]
    if chapters is not None:
        entry[entry.index("--chapters") + 1] = chapters
    env = {**os.environ, "MHA_COURSE_GRADE_ROOT": str(root), "MHA_COURSE_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", *entry], cwd=root, env=env, capture_output=True, text=True, timeout=240)


def results_of(root: Path) -> dict:
    """results.json, held to PrairieLearn's contract."""
    path = root / "results" / "results.json"
    assert path.stat().st_size <= MAX_RESULTS_BYTES
    results = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.validate(results, RESULTS_CONTRACT)
    return results


@pytest.fixture
def job(course, tmp_path):
    """``job({"name": text}, chapter)``: a job of ``chapter``'s question
    (chapter 1's by default) on those student files; returns ``(results,
    completed process)``, the entry point having exited 0 as PrairieLearn
    requires."""
    root = grade_root(course, tmp_path / "grade")

    def run(files: dict[str, str | bytes], chapter=CH01, env: dict | None = None):
        for name, content in files.items():
            path = root / "student" / name
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
        done = run_job(course, root, chapter, env)
        assert done.returncode == 0, done.stdout + done.stderr
        return results_of(root), done

    run.root = root
    return run


def grade_json(path: Path, seed: int, *chapters: str) -> dict:
    """``mha-course grade PATH --json`` at ``seed``."""
    done = subprocess.run([sys.executable, "-m", "grader", "grade", str(path), "--json", "--seed", str(seed)],
                          cwd=COURSE_ROOT, capture_output=True, text=True, timeout=240)
    assert done.stdout, done.stderr
    return json.loads(done.stdout)


def assert_same_as_grade_json(results: dict, expected: dict) -> None:
    """PrairieLearn's results say what ``grade --json`` says: the same tests,
    points and messages, and the score its fraction."""
    assert results["gradable"] is True
    assert results["score"] == pytest.approx(expected["score"] / expected["max_score"])
    assert [test["name"] for test in results["tests"]] == [test["name"] for test in expected["tests"]]
    for test, want in zip(results["tests"], expected["tests"]):
        assert (test["points"], test["max_points"]) == (want["score"], want["max_score"]), test["name"]
        assert "\n".join(filter(None, [test["message"], test["output"]])) == want["output"], test["name"]


# -- the files ---------------------------------------------------------------------------


def test_the_export_has_prairielearns_layout(course):
    files = {path.relative_to(course).as_posix() for path in course.rglob("*") if path.is_file()}
    assert {"README.md", "image/Dockerfile", "image/requirements.txt", "serverFilesCourse/mha-course/run"} <= files
    grader = {name.removeprefix("serverFilesCourse/mha-course/") for name in files
              if name.startswith("serverFilesCourse/")}
    assert grader == {*bundle_sources(), "run"}  # what the Gradescope bundle grades with, and the entry point
    questions = {name for name in files if name.startswith("questions/")}
    assert questions == {f"questions/mha-course/{chapter.module}/{name}"
                         for chapter in CHAPTERS for name in ("info.json", "question.html")}
    assert os.stat(course / "serverFilesCourse" / "mha-course" / "run").st_mode & 0o777 == 0o755


def test_the_image_holds_torch_and_the_libraries_but_none_of_the_course(course):
    """PrairieLearn pulls images from Docker Hub, where they are public."""
    assert sorted(path.name for path in (course / "image").iterdir()) == ["Dockerfile", "requirements.txt"]
    dockerfile = (course / "image" / "Dockerfile").read_text()
    instructions = [line.split()[0] for line in dockerfile.splitlines() if line and not line.startswith((" ", "#"))]
    assert instructions[0] == "FROM" and "USER" not in instructions  # the entry point starts as root
    assert re.search(r"torch==[\d.]+ --index-url https://download\.pytorch\.org/whl/cpu", dockerfile)
    assert f"useradd --system --no-create-home --shell /usr/sbin/nologin {STUDENT_USER}" in dockerfile
    copied = [line for line in dockerfile.splitlines() if line.startswith(("COPY", "ADD"))]
    assert copied == ["COPY requirements.txt /tmp/mha-course-requirements.txt"]
    requirements = (course / "image" / "requirements.txt").read_text().split()
    assert {name.split(">")[0].split("<")[0] for name in requirements} >= {"numpy", "typer", "rich", "pytest", "nbformat"}
    assert not any(name.startswith("torch") for name in requirements)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda chapter: chapter.id)
def test_each_question_is_an_externally_graded_question_of_its_chapter(course, chapter):
    question = info(course, chapter)
    jsonschema.validate(question, QUESTION_CONTRACT)
    options = question["externalGradingOptions"]
    entry = options["entrypoint"]
    assert entry[0] == "/grade/serverFilesCourse/mha-course/run" and options["serverFilesCourse"] == ["mha-course/"]
    assert entry[1:3] == ["--chapters", chapter.id]
    html = (course / "questions" / "mha-course" / chapter.module / "question.html").read_text()
    assert f'<pl-file-upload optional-file-names="{chapter.module}.py, {chapter.module}.ipynb">' in html
    assert "<pl-external-grader-results>" in html
    assert all(f"<code>{exercise.name}</code>" in html for exercise in chapter.exercises)


def test_the_export_is_the_same_byte_for_byte_and_keeps_its_question_ids(course, tmp_path):
    again = tmp_path / "again"
    write_course(again)
    for path in course.rglob("*"):
        if path.is_file():
            assert path.read_bytes() == (again / path.relative_to(course)).read_bytes(), path
    ids = [info(course, chapter)["uuid"] for chapter in CHAPTERS]
    assert len(set(ids)) == len(ids)


# -- jobs ---------------------------------------------------------------------------------


def test_reference_solution_scores_one_as_grade_json_says(job):
    results, done = job({CH01.file_name: SOLUTION})
    assert results["score"] == 1.0 and "sandbox: " in done.stdout
    assert_same_as_grade_json(results, grade_json(CH01.solution(), results["seed"]))


def test_a_broken_file_is_graded_as_grade_json_grades_it(job, tmp_path):
    broken = replace_function(SOLUTION, "self_attention",
                              "def self_attention(x, w_q, w_k, w_v, mask=None):\n    return (x @ w_q\n")
    results, _ = job({CH01.file_name: broken})
    path = tmp_path / CH01.file_name
    path.write_text(broken)
    expected = grade_json(path, results["seed"])
    assert 0 < expected["score"] < expected["max_score"]  # what parses is graded; the line is named
    assert_same_as_grade_json(results, expected)
    assert "syntax error" in next(test["message"] for test in results["tests"] if "self_attention:" in test["name"])


def test_a_missing_file_is_not_gradable_and_says_what_was_expected(job):
    results, _ = job({"ch01_self_attention.txt": "my answer"})
    assert results["gradable"] is False and "score" not in results
    assert f"{CH01.module}.py" in results["format_errors"][0]


def test_a_file_the_grader_cannot_read_is_not_gradable(job):
    results, _ = job({f"{CH01.module}.ipynb": "{not a notebook"})
    assert results["gradable"] is False
    assert results["format_errors"][0].startswith(f"ch01: {CH01.module}.ipynb: ")


def test_a_grader_that_cannot_start_leaves_a_not_gradable_results_json(job):
    results, done = job({CH01.file_name: SOLUTION}, env={"MHA_COURSE_PYTHON": "false"})
    assert results["gradable"] is False and "exit status 1" in results["format_errors"][0]
    assert "not a verdict on your code" in results["format_errors"][0]


def test_a_submission_reaches_neither_the_course_nor_the_results(job):
    """The job's copy of the reference and of the grader lie in /grade, next
    to the results: student code reads none, writes none, and a process it
    forks cannot write the results after the grader has."""
    course = job.root / "serverFilesCourse" / "mha-course"
    results_path = job.root / "results" / "results.json"
    attack = replace_function(SOLUTION, "self_attention", f'''
def self_attention(x, w_q, w_k, w_v, mask=None):
    with open({str(course / "solutions" / CH01.file_name)!r}) as reference:
        reference.read()
    return x
''') + forging([results_path, course / "grader" / "catalog.py"], {"gradable": True, "score": 1.0}, mode="a")
    catalog = (course / "grader" / "catalog.py").read_bytes()
    results, _ = job({CH01.file_name: attack})
    points = {test["name"].split(":")[0]: (test["points"], test["max_points"]) for test in results["tests"]}
    assert points.pop("ch01 self_attention")[0] == 0
    assert all(score == maximum for score, maximum in points.values()), points
    assert "PermissionError" in next(test["message"] + test["output"] for test in results["tests"]
                                     if test["name"].startswith("ch01 self_attention"))
    time.sleep(0.5)  # a process left behind would have written by now
    assert results_of(job.root) == results
    assert (course / "grader" / "catalog.py").read_bytes() == catalog


def test_as_root_student_code_runs_as_an_unprivileged_account(job):
    from grader.hosted import can_run_python

    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("only root can change user")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no account nobody")
    if not can_run_python(nobody.pw_uid, nobody.pw_gid):
        pytest.skip("nobody cannot read this Python's files (installed in a private home folder?)")
    # softmax is right only when it does not run as root.
    results, done = job({CH01.file_name: SOLUTION + '''
_softmax = softmax
def softmax(x, dim=-1):
    with open("/proc/self/status") as status:
        uid = next(line.split()[1] for line in status if line.startswith("Uid:"))
    return x if uid == "0" else _softmax(x, dim)
'''}, env={"MHA_COURSE_STUDENT_USER": "nobody"})
    assert "student code runs as nobody" in done.stdout, done.stdout + done.stderr
    assert results["score"] == 1.0


def test_an_attack_of_the_corpus_scores_nothing_and_its_chapter_keeps_the_rest(job, course):
    """Two of tests/test_attacks.py's corpus, in one job of a question of two
    chapters: each target scores 0, as `grade --json` says, and every
    exercise that does not build on it keeps its points."""
    from test_attacks import BY_NAME, json_keeps_the_others_points

    attacks = [BY_NAME["execs-the-reference"], BY_NAME["mha-forward-with-torch-functions-off"]]
    files = {f"{find_chapter(attack.chapter).module}.py": attack.source() for attack in attacks}
    for name, source in files.items():
        (job.root / "student" / name).write_text(source)
    done = run_job(course, job.root, CH01, chapters="ch01 ch03")
    assert done.returncode == 0, done.stderr
    results = results_of(job.root)
    as_gradescope = [{"name": test["name"], "score": test["points"], "max_score": test["max_points"],
                      "output": test["message"] + "\n" + test["output"]} for test in results["tests"]]
    for attack in attacks:
        json_keeps_the_others_points(as_gradescope, attack)


def test_the_entry_point_keeps_every_secret_out_of_its_workers(job):
    from test_secrets import assert_nothing_secret, searching

    results, _ = job({CH01.file_name: searching(CH01)})
    first = results["tests"][0]
    assert_nothing_secret(first["message"] + "\n" + first["output"])


# -- the results' size ---------------------------------------------------------------------


def test_results_over_one_mib_are_cut_to_fit_and_say_so():
    results = {"gradable": True, "score": 0.5, "tests": [
        {"name": "long", "points": 0, "max_points": 2, "message": "fails", "output": "x" * (3 * 2**20)},
        {"name": "short", "points": 1, "max_points": 1, "message": "passes", "output": "fine"}]}
    fitted = fit(results)
    assert len(json.dumps(fitted, indent=2).encode()) + 1 <= MAX_RESULTS_BYTES
    assert fitted["tests"][0]["output"].endswith("characters cut: the results must fit in 1 MiB]")
    assert fitted["tests"][1]["output"] == "fine"
    jsonschema.validate(fitted, RESULTS_CONTRACT)


# -- the command ---------------------------------------------------------------------------


def mha_course(*args: str, cwd: Path = COURSE_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env={**os.environ, "COLUMNS": "80"})


def test_the_command_writes_the_course_files(tmp_path, course):
    out = tmp_path / "pl"
    out.mkdir()  # an empty folder is taken
    done = mha_course("prairielearn", str(out), "-c", "2", "--chapter", "ch01", "--image", "someone/attention")
    assert done.returncode == 0, done.stderr
    assert "questions ch01, ch02, image someone/attention" in done.stdout
    assert sorted(path.name for path in (out / "questions" / "mha-course").iterdir()) == [CH01.module, CH02.module]
    assert info(out, CH02)["externalGradingOptions"]["image"] == "someone/attention"
    assert "docker build -t someone/attention image/" in (out / "README.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["taken"], "taken is not empty"),
    (["missing/pl"], "no such directory: missing"),
    (["a-file"], "a-file exists and is not a folder"),
    (["pl", "--chapter", NO_SUCH_CHAPTER], f"unknown chapter '{NO_SUCH_CHAPTER}'"),
    ([str(COURSE_ROOT / "pl")], "is inside the course"),
])
def test_usage_errors_are_one_line_exit_2_and_change_nothing(tmp_path, args, message):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("kept")
    (tmp_path / "a-file").write_text("kept")
    before = sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*"))
    done = mha_course("prairielearn", *args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*")) == before
    assert not (COURSE_ROOT / "pl").exists()
