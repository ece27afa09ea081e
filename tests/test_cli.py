"""The command line, end to end, as a student and an instructor run it."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from grader.catalog import CHAPTERS, COURSE_ROOT

TOTAL = sum(chapter.points for chapter in CHAPTERS)


def mha_course(*args: str, cwd=COURSE_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "COLUMNS": "200"})


# Without CUDA, --device auto grades on the CPU, where a grade without --device does. There
# the solutions' run says --device auto, and test_auto_device_grades_where_it_can reads it
# instead of starting a grade of its own (a fresh Python that imports torch); the grades
# without --device are the stubs', the JSON runs' and the 80-column one's. With CUDA, auto is
# cuda: the solutions' run keeps the default, and the auto test grades ch01 on its own.
AUTO_IS_THE_CPU = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def solutions_run():
    """``grade --solutions --seed 7`` (with ``--device auto`` where that is the CPU)."""
    return mha_course("grade", "--solutions", "--seed", "7", *(("--device", "auto") if AUTO_IS_THE_CPU else ()))


@pytest.fixture(scope="module")
def stubs_run():
    return mha_course("grade", "--seed", "7")


def test_solutions_get_full_marks(solutions_run):
    assert solutions_run.returncode == 0, solutions_run.stdout + solutions_run.stderr
    assert f"Total: {TOTAL} / {TOTAL} points" in solutions_run.stdout
    assert "✗" not in solutions_run.stdout


def test_untouched_stubs_get_nothing_and_say_so(stubs_run):
    assert stubs_run.returncode == 1
    assert f"Total: 0 / {TOTAL} points" in stubs_run.stdout
    for chapter in CHAPTERS:
        for exercise in chapter.exercises:
            row = next(line for line in stubs_run.stdout.splitlines() if f" {exercise.name} " in f" {line} ")
            assert ("· optional" if exercise.optional else "not implemented yet") in row


@pytest.fixture(scope="module")
def usage_error_run():
    """``usage_error_run(*args)``: ``mha_course(*args)`` in the course's
    folder, run once for the module. Some command lines are checked for
    more than one thing (two parts of one message, in two rows of the
    table below or in two tests); each is run once and every check reads
    that one run, as the same command line gives the same answer."""
    runs: dict[tuple[str, ...], subprocess.CompletedProcess] = {}

    def run(*args: str) -> subprocess.CompletedProcess:
        if args not in runs:
            runs[args] = mha_course(*args)
        return runs[args]

    return run


@pytest.mark.parametrize("args, message", [
    (["grade", "nonsense"], "unknown chapter 'nonsense'"),
    (["grade", "--dir", "missing/"], "no such directory: missing"),
    (["grade", "ch01", "--dir", "chapters"], "no file for ch01 in chapters (expected ch01_self_attention.py or "
     ".ipynb, or a name with ch01 as a word, such as alice_ch01.py)"),
    (["grade", "--solutions", "--dir", "exercises"], "either --solutions or --dir"),
    (["grade", "notes.txt"], "only .py files and .ipynb notebooks can be graded"),
    (["grade", "elsewhere/ch01_self_attention.py"], "no such file"),
    (["grade", "README.md"], "only .py files"),
    (["grade", "--device", "gpu"], "Invalid value for '--device'"),
    (["grade", "--device", "tpu"], "Invalid value for '--device': 'tpu' is not one of 'cpu', 'cuda', 'auto'."),
    (["grade", "--device", "tpu"], "(see mha-course grade --help)"),
    (["grade", "--timeout", "soon"], "(see mha-course grade --help)"),
    (["regrade"], "(see mha-course --help)"),
    (["grade", "exercises"], "exercises is a folder: to grade the files in it, use --dir exercises"),
    (["grade", "--dir", "solutions/ch01_self_attention.py"],
     "--dir solutions/ch01_self_attention.py is a file, not a folder: name it as a target, without --dir"),
    (["grade", "--solutions", "true"],
     "unknown chapter 'true': a flag (--solutions, --json, --verbose) takes no value"),
    (["grade", "--timeout", "soon"], "Invalid value for '--timeout'"),
    (["regrade"], "No such command 'regrade'"),
    (["grade", "[/]"], "unknown chapter '[/]'"),
    (["verify", "--chapter", "ch99"], "unknown chapter 'ch99'"),
])
def test_usage_errors_are_one_line_and_exit_2(usage_error_run, args, message):
    done = usage_error_run(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr + done.stdout


def test_a_folder_named_like_a_file_is_a_folder_not_a_missing_file(tmp_path, usage_error_run):
    (tmp_path / "ch01_dir.py").mkdir()
    done = mha_course("grade", "ch01_dir.py", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "ch01_dir.py is a folder, not a file: to grade the files in it, use --dir ch01_dir.py" in done.stderr
    assert "Value error" not in usage_error_run("grade", "--device", "tpu").stderr


def test_a_file_named_for_no_chapter_is_a_usage_error(tmp_path):
    path = tmp_path / "attention.py"
    path.write_text("x = 1\n")
    done = mha_course("grade", str(path))
    assert done.returncode == 2 and "cannot tell which chapter" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_a_usage_error():
    done = mha_course("grade", "--solutions", "--device", "cuda")
    assert done.returncode == 2
    assert "CUDA is not available" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_solutions_get_full_marks_on_cuda():
    done = mha_course("grade", "--solutions", "--device", "cuda", "--seed", "7")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Total: {TOTAL} / {TOTAL} points" in done.stdout and "cuda" in done.stdout


def test_auto_device_grades_where_it_can(request):
    """``--device auto`` grades (exit 0) and the total's line names the
    device: cuda where there is CUDA, else the CPU. Without CUDA the
    solutions' run is that grade (see AUTO_IS_THE_CPU)."""
    if AUTO_IS_THE_CPU:
        done = request.getfixturevalue("solutions_run")
    else:
        done = mha_course("grade", "ch01", "--solutions", "--device", "auto", "--seed", "7")
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("cuda" if torch.cuda.is_available() else "cpu") in done.stdout.splitlines()[-1]


def test_ctrl_c_stops_everything_with_one_line():
    # Ctrl-C reaches the terminal's whole process group: the grader, the
    # copies grading chapters side by side, fork servers and workers.
    process = subprocess.Popen([sys.executable, "-m", "grader", "grade", "--solutions"], cwd=COURSE_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True,  # a group of its own, as a terminal gives
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(2.0)  # torch imported, checks running (or, on a slow machine, still importing)
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130 and err.strip() == "interrupted", out + err
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # workers die with their parents
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("processes of the grade are still running")


def test_json_follows_gradescopes_schema():
    done = mha_course("grade", "--solutions", "--json", "--seed", "7")
    assert done.returncode == 0
    results = json.loads(done.stdout)  # stdout holds the JSON and nothing else
    assert results["score"] == results["max_score"] == TOTAL
    assert isinstance(results["execution_time"], float)
    names = [test["name"] for test in results["tests"]]
    assert len(names) == sum(len(chapter.exercises) for chapter in CHAPTERS)
    for test in results["tests"]:
        assert set(test) >= {"name", "score", "max_score", "status", "output", "visibility"}
        assert test["status"] == "passed" and test["score"] == test["max_score"]


def test_json_of_a_failing_run_reports_each_exercise(tmp_path):
    path = tmp_path / "ch01_self_attention.py"
    solution = (COURSE_ROOT / "solutions" / "ch01_self_attention.py").read_text()
    path.write_text(solution.replace("scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0", 1))
    done = mha_course("grade", str(path), "--json", "--seed", "7")
    assert done.returncode == 1
    tests = {test["name"].split(":")[0]: test for test in json.loads(done.stdout)["tests"]}
    failed = tests["ch01 scaled_dot_product_attention"]
    assert failed["status"] == "failed" and failed["score"] == 0
    assert "not multiplied by 1/sqrt(d_k)" in failed["output"]
    assert tests["ch01 softmax"]["status"] == "passed"


def test_list_shows_every_exercise_with_points():
    done = mha_course("list")
    assert done.returncode == 0
    for chapter in CHAPTERS:
        for exercise in chapter.exercises:
            assert exercise.name in done.stdout


def test_list_keeps_every_name_and_point_whole_at_80_columns():
    done = subprocess.run([sys.executable, "-m", "grader", "list"], capture_output=True, text=True,
                          cwd=COURSE_ROOT, timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    for chapter in CHAPTERS:
        assert f"{chapter.id} · {chapter.title} · {chapter.points} points" in done.stdout
        for exercise in chapter.exercises:
            assert re.search(rf"^ {exercise.name} +{exercise.points} ", done.stdout, re.MULTILINE), exercise.name


def test_grade_keeps_every_name_and_point_whole_at_80_columns(tmp_path):
    """Every row of every state (passed, failed with a long reason and a
    hint, not implemented) keeps its exercise name and points whole."""
    from grader.known_bugs import KNOWN_BUGS, apply_bug

    source = (COURSE_ROOT / "solutions" / "ch01_self_attention.py").read_text(encoding="utf-8")
    bug = next(bug for bug in KNOWN_BUGS["ch01"] if bug.name == "no-scale")
    (tmp_path / "ch01_self_attention.py").write_text(apply_bug(source, bug), encoding="utf-8")
    for chapter in CHAPTERS[1:]:
        stub = chapter.stub().read_text(encoding="utf-8")
        (tmp_path / chapter.file_name).write_text(stub, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "grader", "grade", "--dir", str(tmp_path), "--seed", "1"],
                          capture_output=True, text=True, cwd=COURSE_ROOT, timeout=300,
                          env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 1, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    rows = re.findall(r"^ ?(\w+) +(✓ pass|✗ fail|· todo|· optional) +(\d+) / (\d+)\b", done.stdout,
                      re.MULTILINE)
    assert {(name, int(total)) for name, _, _, total in rows} == {
        (exercise.name, exercise.points) for chapter in CHAPTERS for exercise in chapter.exercises}
    assert {status for _, status, _, _ in rows} == {"✓ pass", "✗ fail", "· todo", "· optional"}


def test_build_check_passes_on_a_clean_tree():
    done = mha_course("build", "--check")
    assert done.returncode == 0, done.stderr


def test_help_reads_like_documentation():
    done = mha_course("grade", "--help")
    assert done.returncode == 0
    for option in ("--dir", "--solutions", "--device", "--timeout", "--json", "--seed"):
        assert option in done.stdout


@pytest.mark.parametrize("command", ["", "grade", "watch", "list", "verify", "build", "release", "batch",
                                     "gradescope"])
def test_every_help_fits_80_columns_and_shows_no_value_for_a_flag(command):
    done = subprocess.run([sys.executable, "-m", "grader", *filter(None, [command]), "--help"],
                          capture_output=True, text=True, cwd=COURSE_ROOT, timeout=300,
                          env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    assert "<bool>" not in done.stdout  # --solutions, --json, --help take no value
    # An argument is named as its help names it (SUBMISSIONS, [TARGETS...]), never
    # typer's {submissions} or [targets]... over a type such as <list[str]>.
    (usage,) = [line for line in done.stdout.splitlines() if "Usage:" in line]
    assert not re.search(r"\[[a-z]", usage) and not re.search(r"[{}]|<list\[", done.stdout), usage
    assert "COMMAND [ARGS]..." in usage if not command else usage.split()[2] == command


def test_the_student_editions_seed_help_says_it_grades_with_its_recorded_seeds(tmp_path):
    # An edition as is_student_edition tells one: recordings, and no solutions/ beside grader/.
    shutil.copytree(COURSE_ROOT / "grader", tmp_path / "grader", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "grader" / "recorded").mkdir()
    (tmp_path / "grader" / "recorded" / "index.json").write_text('{"format": 2, "seeds": [5, 6]}')
    for command in ("grade", "watch"):
        done = subprocess.run([sys.executable, "-m", "grader", command, "--help"], capture_output=True,
                              text=True, cwd=tmp_path, timeout=300,
                              env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        assert "--solutions" not in done.stdout  # the edition it is
        assert "a fresh one" not in done.stdout
        assert "one of the seeds this edition recorded" in done.stdout
