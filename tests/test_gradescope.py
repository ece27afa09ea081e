"""The Gradescope autograder: the bundle's layout, and its run_autograder run
with bash against folders laid out like Gradescope's /autograder.

setup.sh is never run here (it needs the network); the course is already
installed in this Python, so run_autograder is pointed at it
(MHA_COURSE_PYTHON) and grades with the grader unpacked from the bundle.
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
import zipfile
from pathlib import Path

import pytest

from conftest import NO_SUCH_CHAPTER, forging
from grader.catalog import CHAPTERS, COURSE_ROOT, find_chapter
from grader.gradescope import SCRIPTS, write_bundle
from grader.hosted import TEMPLATES
from grader.notebooks import notebook_text

CH01, CH02 = find_chapter("ch01"), find_chapter("ch02")
TOTAL = sum(chapter.points for chapter in CHAPTERS)
EXERCISES = [f"{chapter.id} {exercise.name}" for chapter in CHAPTERS for exercise in chapter.exercises]
OPTIONAL = {f"{chapter.id} {exercise.name}" for chapter in CHAPTERS for exercise in chapter.exercises
            if exercise.optional}
SOLUTION = CH01.solution().read_text(encoding="utf-8")
STUB = CH01.stub().read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "autograder.zip"
    write_bundle(out)
    return out


def gradescope_root(bundle: Path, folder: Path) -> Path:
    """``folder`` laid out like Gradescope's /autograder, the bundle in source/."""
    with zipfile.ZipFile(bundle) as archive:
        archive.extractall(folder / "source")
    (folder / "submission").mkdir()
    (folder / "results").mkdir()
    return folder


def run_autograder(root: Path, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "MHA_COURSE_PYTHON": python,
           "MHA_COURSE_VENV": str(root / "no-venv")}
    return subprocess.run(["bash", str(root / "source" / "run_autograder")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=240)


def results_of(root: Path) -> dict:
    return json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))


def scores(results: dict) -> dict[str, tuple[int, int]]:
    """``{"ch01 softmax": (score, max_score)}``, in the order of results.json."""
    return {test["name"].split(":")[0]: (test["score"], test["max_score"]) for test in results["tests"]}


def submit(root: Path, files: dict[str, str | bytes]) -> tuple[dict, subprocess.CompletedProcess]:
    """Writes the files into ``root``'s submission/, runs run_autograder
    (which must exit 0) and returns ``(results, completed process)``."""
    for name, content in files.items():
        path = root / "submission" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    done = run_autograder(root)
    assert done.returncode == 0, done.stdout + done.stderr
    return results_of(root), done


@pytest.fixture
def autograder(bundle, tmp_path):
    """``autograder({"name": text})`` writes the files into submission/,
    runs run_autograder and returns ``(results, completed process)``."""
    root = gradescope_root(bundle, tmp_path / "autograder")

    def run(files: dict[str, str | bytes]):
        return submit(root, files)

    run.root = root
    return run


# -- the bundle ------------------------------------------------------------------------


def test_bundle_has_gradescopes_layout(bundle):
    with zipfile.ZipFile(bundle) as archive:
        infos = {info.filename: info for info in archive.infolist()}
        setup = archive.read("setup.sh").decode()
        runner = archive.read("run_autograder").decode()
    names = set(infos)
    # The two scripts at the root of the zip, executable.
    for script in ("setup.sh", "run_autograder"):
        assert (infos[script].external_attr >> 16) & 0o777 == 0o755
    assert {"pyproject.toml", "README.md", "grader/__init__.py", "grader/gradescope.py",
            "grader/chapters/pytest.ini", "grader/oracles.py", "grader/checks.py"} <= names
    for chapter in CHAPTERS:
        assert f"solutions/{chapter.module}.py" in names
        assert f"grader/chapters/{chapter.id}/test_{chapter.module}.py" in names
        for part in ("__init__.py", "bugs.py", "oracles.py"):
            assert f"grader/chapters/{chapter.id}/{part}" in names
    # What grading never reads stays out; of the lessons, only the data checks read.
    assert "chapters/08_tiny_language_model/text.txt" in names
    assert not [name for name in names if name.startswith(("tests/", "exercises/", ".git"))
                or name.startswith("chapters/") and not name.endswith(".txt")
                or "__pycache__" in name or name.endswith((".pyc", ".ipynb"))]
    # A CPU build of torch first, then the course from the bundled source.
    assert setup.startswith("#!/usr/bin/env bash") and runner.startswith("#!/usr/bin/env bash")
    cpu_torch = setup.index("torch --index-url https://download.pytorch.org/whl/cpu")
    assert cpu_torch < setup.index('-e "$source_dir"')
    for script in (setup, runner):
        assert not re.search(r"@[A-Z_]+@", script)  # every placeholder filled in
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_bundle_is_the_same_byte_for_byte(bundle, tmp_path):
    again = tmp_path / "again.zip"
    write_bundle(again)
    assert again.read_bytes() == bundle.read_bytes()


# -- run_autograder on submissions -----------------------------------------------------


def test_reference_solutions_get_full_marks(autograder):
    files = {c.file_name: c.solution().read_text() for c in CHAPTERS}
    results, done = autograder(files)
    assert results["score"] == results["max_score"] == TOTAL
    assert list(scores(results)) == EXERCISES
    assert all(score == maximum and (maximum > 0) != (name in OPTIONAL)
               for name, (score, maximum) in scores(results).items())
    assert all(test["status"] == "passed" and test["visibility"] == "visible" for test in results["tests"])
    assert results["stdout_visibility"] == "hidden"
    assert f"ch01: graded {CH01.module}.py" in results["output"].splitlines()  # as `grade` names it
    assert isinstance(results["execution_time"], float)
    # The grader unpacked from the bundle graded, not the one installed here.
    assert f"grader from {(autograder.root / 'source' / 'grader').resolve()}" in done.stdout


def test_untouched_stubs_score_zero(autograder):
    files = {c.file_name: c.stub().read_text() for c in CHAPTERS}
    results, _ = autograder(files)
    assert results["score"] == 0 and results["max_score"] == TOTAL
    assert list(scores(results)) == EXERCISES
    assert all(test["score"] == 0 and test["output"].startswith("not implemented yet")
               for test in results["tests"] if test["name"].split(":")[0] not in OPTIONAL)
    # An optional exercise left alone fails nothing: 0 of 0, passed.
    assert all(test["status"] == "passed" and test["max_score"] == 0 and test["output"].startswith("optional")
               for test in results["tests"] if test["name"].split(":")[0] in OPTIONAL)


def test_a_notebook_in_a_folder_among_other_files(autograder):
    notebook = notebook_text(CH01, SOLUTION, COURSE_ROOT, "solutions")
    results, _ = autograder({
        f"homework/{CH01.module}.ipynb": notebook,
        f"homework/{CH01.module}.py": STUB,  # the untouched .py beside the notebook worked in
        "homework/README.md": "my notes",
        "homework/scratch.py": "x = 1\n",
        f"__MACOSX/homework/._{CH01.module}.ipynb": b"\x00\x05\x16\x07 Mac OS X metadata",
    })
    assert results["score"] == CH01.points and results["max_score"] == TOTAL
    for name, (score, maximum) in scores(results).items():
        assert score == (maximum if name.startswith("ch01") else 0)
    missing = next(test for test in results["tests"] if test["name"].startswith("ch02"))
    assert f"expected {CH02.module}.py or {CH02.module}.ipynb" in missing["output"]
    # The file graded and why, in the words of `mha-course grade` and of batch's results.
    assert (f"ch01: graded homework/{CH01.module}.ipynb (it has more written than {CH01.module}.py)"
            in results["output"].splitlines())
    assert f"Ignored homework/{CH01.module}.py: ch01 was graded from homework/{CH01.module}.ipynb" \
        in results["output"]
    assert "Ignored homework/scratch.py: its name names no chapter" in results["output"]
    assert "__MACOSX" not in results["output"]
    assert results["extra_data"]["files"] == {"ch01": f"homework/{CH01.module}.ipynb"}


def test_a_submission_cannot_write_its_own_results(autograder):
    results_path = autograder.root / "results" / "results.json"
    forger = SOLUTION + forging([results_path], {"score": 1000, "output": "forged", "tests": []})
    results, _ = autograder({CH01.file_name: forger})
    # Its statements ran, in the sandbox: its honest exercises keep their points,
    # and what it wrote (or its child would have) is not the results.
    assert results["score"] == CH01.points
    assert "forged" not in results_path.read_text()
    time.sleep(0.5)  # a process left behind would have written by now
    assert results_of(autograder.root) == results


def test_as_root_student_code_runs_as_an_unprivileged_account(bundle, tmp_path):
    from grader.hosted import can_run_python

    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("only root can change user")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no account nobody")
    if not can_run_python(nobody.pw_uid, nobody.pw_gid):
        pytest.skip("nobody cannot read this Python's files (installed in a private home folder?)")
    root = gradescope_root(bundle, tmp_path / "autograder")
    # softmax is right only when it does not run as root.
    (root / "submission" / CH01.file_name).write_text(SOLUTION + '''
_softmax = softmax
def softmax(x, dim=-1):
    with open("/proc/self/status") as status:
        uid = next(line.split()[1] for line in status if line.startswith("Uid:"))
    return x if uid == "0" else _softmax(x, dim)
''')
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "MHA_COURSE_PYTHON": sys.executable,
           "MHA_COURSE_STUDENT_USER": "nobody"}
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env,
                          capture_output=True, text=True, timeout=240)
    assert "student code runs as nobody" in done.stdout, done.stdout + done.stderr
    assert results_of(root)["score"] == CH01.points


def test_an_empty_submission_gets_zero_and_says_what_was_expected(autograder):
    # A link to the reference solution is not the student's work.
    link = autograder.root / "submission" / CH01.file_name
    link.symlink_to(autograder.root / "source" / "solutions" / CH01.file_name)
    results, _ = autograder({"README.md": "I forgot my files"})
    assert results["score"] == 0 and results["max_score"] == TOTAL
    assert list(scores(results)) == EXERCISES and all(s == 0 for s, _ in scores(results).values())
    assert "No exercise file was found in the submission" in results["output"]
    assert CH01.file_name in results["output"] and ".ipynb" in results["output"]
    assert f"Ignored {CH01.module}.py: a link, not a file to grade" in results["output"]


def test_a_grader_that_cannot_start_still_leaves_a_results_json(bundle, tmp_path):
    root = gradescope_root(bundle, tmp_path / "autograder")
    (root / "submission" / CH01.file_name).write_text(SOLUTION)
    (root / "results" / "results.json").write_text('{"score": 1000}')  # left by someone else
    done = run_autograder(root, python=str(tmp_path / "no-such-python"))
    assert done.returncode == 0
    results = results_of(root)
    assert results["score"] == 0 and results["tests"] == []
    assert "not a verdict on your code" in results["output"]


def test_without_setup_the_results_say_to_run_setup_sh(bundle, tmp_path):
    """run_autograder tried on a machine where setup.sh never ran: its Python
    lacks torch, and results.json says so in one line, with what to do."""
    bare = tmp_path / "bare"  # a Python with nothing installed, like a fresh python3
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    root = gradescope_root(bundle, tmp_path / "autograder")
    (root / "submission" / CH01.file_name).write_text(SOLUTION)
    done = run_autograder(root, python=str(bare / "bin" / "python"))
    assert done.returncode == 0
    results = results_of(root)
    assert results["score"] == 0 and results["tests"] == []
    output = results["output"]
    assert len(output.splitlines()) == 1
    assert "lacks torch" in output and "Run setup.sh first" in output and "MHA_COURSE_PYTHON" in output
    assert "ModuleNotFoundError" not in output + done.stdout + done.stderr  # no traceback
    assert output in done.stdout  # the instructor trying it sees it too


def test_the_runner_script_says_how_to_run_it_outside_gradescope(bundle):
    with zipfile.ZipFile(bundle) as archive:
        runner = archive.read("run_autograder").decode()
    header = runner.split("set -u")[0]
    assert "run setup.sh first" in header and "MHA_COURSE_PYTHON" in header


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_scripts_are_bash_that_parses_with_every_placeholder_filled(bundle, name):
    """``bash -n`` on the template as it is in grader/templates/ and on the
    script in the bundle; the bundle's keeps no @PLACEHOLDER@ unfilled."""
    with zipfile.ZipFile(bundle) as archive:
        script = archive.read(name).decode()
    assert not re.search(r"@[A-Z_]+@", script)
    for text in ((TEMPLATES / name).read_text(encoding="utf-8"), script):
        parsed = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30)
        assert parsed.returncode == 0, parsed.stderr
    broken = subprocess.run(["bash", "-n"], input=script + "\nif then\n", capture_output=True, text=True)
    assert broken.returncode != 0  # bash -n does judge


def test_an_assignment_of_some_chapters_with_results_after_the_due_date(tmp_path):
    bundle = tmp_path / "ch02.zip"
    write_bundle(bundle, [CH02], visibility="after_due_date")
    root = gradescope_root(bundle, tmp_path / "autograder")
    (root / "submission" / CH01.file_name).write_text(SOLUTION)
    assert run_autograder(root).returncode == 0
    results = results_of(root)
    assert results["score"] == 0 and results["max_score"] == CH02.points
    assert list(scores(results)) == [f"ch02 {exercise.name}" for exercise in CH02.exercises]
    assert results["visibility"] == "after_due_date"
    assert all(test["visibility"] == "after_due_date" for test in results["tests"])
    assert f"Ignored {CH01.module}.py: ch01 is not graded in this assignment" in results["output"]


# -- the command -------------------------------------------------------------------------


def mha_course(*args: str, cwd: Path = COURSE_ROOT, columns: int = 200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env={**os.environ, "COLUMNS": str(columns)})


def test_help_at_80_columns_names_the_zip_and_every_visibility_whole():
    done = mha_course("gradescope", "--help", columns=80)
    assert done.returncode == 0, done.stderr
    assert "Usage: mha-course gradescope [OPTIONS] OUT" in done.stdout
    words = set(re.findall(r"[\w-]+", done.stdout))  # a choice cut at the column's edge is two words
    assert {"visible", "after_due_date", "after_published", "hidden"} <= words
    assert max(map(len, done.stdout.splitlines())) <= 80


def test_the_command_writes_the_bundle(tmp_path, bundle):
    out = tmp_path / "autograder.zip"
    done = mha_course("gradescope", str(out))
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    with zipfile.ZipFile(out) as built, zipfile.ZipFile(bundle) as expected:
        assert built.namelist() == expected.namelist()
    done = mha_course("gradescope", str(out), "-c", "2", "--chapter", "ch01", "--visibility", "hidden")
    assert done.returncode == 0 and "grades ch01, ch02 (19 points), results hidden" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["autograder.tar"], "must be a .zip file"),
    (["missing/autograder.zip"], "no such directory: missing"),
    (["."], "must be a .zip file"),
    (["autograder.zip", "--chapter", NO_SUCH_CHAPTER], f"unknown chapter '{NO_SUCH_CHAPTER}'"),
    (["autograder.zip", "--visibility", "sometimes"], "Invalid value for '--visibility'"),
])
def test_usage_errors_are_one_line_and_exit_2(tmp_path, args, message):
    done = mha_course("gradescope", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_folder_named_like_a_zip_is_a_usage_error(tmp_path):
    (tmp_path / "autograder.zip").mkdir()
    done = mha_course("gradescope", "autograder.zip", cwd=tmp_path)
    assert done.returncode == 2 and "is a folder" in done.stderr


def test_the_bundle_needs_the_reference_solutions(tmp_path):
    from grader.gradescope import BundleError

    edition = tmp_path / "edition"
    shutil.copytree(COURSE_ROOT / "grader", edition / "grader",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(COURSE_ROOT / name, edition / name)
    with pytest.raises(BundleError, match="build it from the instructor's tree"):
        write_bundle(tmp_path / "autograder.zip", root=edition)
    assert not (tmp_path / "autograder.zip").exists()


# -- the attack corpus, run in the bundle (tests/test_attacks.py) ------------------------


def test_the_reference_and_the_grader_are_out_of_a_submissions_reach(autograder):
    source = autograder.root / "source"
    attack = SOLUTION + f'''

def self_attention(x, w_q, w_k, w_v, mask=None):
    for path in ({str(CH01.solution(source))!r}, {str(source / "grader" / "bugs" / "ch01.py")!r}):
        with open(path) as secret:
            secret.read()
    return x
'''
    results, _ = autograder({CH01.file_name: attack})
    for name, (score, maximum) in scores(results).items():
        if name.startswith("ch01 self_attention"):
            assert score == 0
        elif name.startswith("ch01"):
            assert score == maximum, name
    output = next(test["output"] for test in results["tests"] if test["name"].startswith("ch01 self_attention"))
    assert "PermissionError" in output


# The attacks of tests/test_attacks.py's corpus that are run in the bundle.
BUNDLE_ATTACKS = [
    "alias-hides-internals", "refusals-replaced-at-import", "mha-forward-with-torch-functions-off",
    "tensor-subclass-unwraps", "scores-in-a-subclass", "runs-a-program",
    "portability-tracker-silenced", "numpy-exercise-uses-torch", "execs-the-reference",
    "appends-to-the-grader", "fork-flood", "stops-the-fork-server", "writes-200-mib",
]
# Why some attacks share a run: each run_autograder is a fresh Python that imports torch
# before it grades (most of a one-chapter run's time), it grades each chapter of the
# submission apart from the others, and each attack's test reads only its own chapter's
# part of results.json. A submission holds one file a chapter, so the ten attacks on ch01
# take a run each; the attack on another chapter rides in the run of a ch01 attack, one
# that is only refused a call (none that forks, floods or fills the disk): 10 runs, not 13.
# {attack on another chapter: the ch01 attack whose run grades it too}
RIDES_WITH = {
    "mha-forward-with-torch-functions-off": "alias-hides-internals",  # ch03
    "portability-tracker-silenced": "refusals-replaced-at-import",  # ch04
    "scores-in-a-subclass": "tensor-subclass-unwraps",  # ch07
}


@pytest.fixture(scope="module")
def attack_results(bundle, tmp_path_factory):
    """``attack_results(name)``: the results.json of the run_autograder run
    that graded attack ``name`` (with the attacks that share its run, see
    RIDES_WITH). Each run is made the first time one of its attacks asks
    for it, so a test waits for one run at most."""
    from test_attacks import BY_NAME

    runs: dict[str, dict] = {}

    def results(name: str) -> dict:
        first = RIDES_WITH.get(name, name)
        if first not in runs:
            together = [first, *(other for other, host in RIDES_WITH.items() if host == first)]
            files = {f"{find_chapter(BY_NAME[attack].chapter).module}.py": BY_NAME[attack].source()
                     for attack in together}
            assert len(files) == len(together), f"{together}: two attacks on one chapter cannot share a run"
            root = gradescope_root(bundle, tmp_path_factory.mktemp(f"autograder-{first}"))
            runs[first], _ = submit(root, files)
        return runs[first]

    return results


@pytest.mark.parametrize("name", BUNDLE_ATTACKS)
def test_every_attack_scores_nothing_in_the_bundle(attack_results, name):
    """The attack's target scores 0 and every exercise of its chapter that
    does not build on the target keeps its points; the installed grader's
    folder is left unwritten."""
    from test_attacks import BY_NAME, grader_untouched, json_keeps_the_others_points

    attack = BY_NAME[name]
    results = attack_results(name)
    json_keeps_the_others_points(results["tests"], attack)
    grader_untouched()
