"""What a command imports: only what it uses. torch takes one to three
seconds to import, and a grade of one chapter should cost little more; so
a student's command imports neither the instructor's commands (``cli.main``
registers them only where one may be asked for) nor what only another
command shows, and typer's range in pyproject.toml leaves out the versions
that bring pydantic (typer 0.29 validates every value through it: about
0.1 to 0.3 s more on every command, ``list`` and a usage error included)."""

import importlib.metadata
import os
import re
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

from grader.catalog import COURSE_ROOT

# Runs mha-course, then writes the modules the command's own process holds
# at its end (not its forks': the fork servers import sympy for the meta runs).
PROGRAM = """
import atexit, os, sys
me, out = os.getpid(), sys.argv.pop(1)

def modules():
    if os.getpid() == me:
        with open(out, "w") as file:
            file.write("\\n".join(sorted(sys.modules)))

atexit.register(modules)  # the first registered, so the last run: after everything the command did
if os.environ.get("TORCH_FIRST"):  # what torch imports itself (sympy, with some versions)
    import torch
    with open(out + ".torch", "w") as file:
        file.write("\\n".join(sorted(sys.modules)))
sys.argv[0] = "mha-course"
from grader.cli import run
run()
"""

# Never imported by a student's command.
INSTRUCTORS = ("grader.instructor_commands", "grader.verify", "grader.build", "grader.lesson_checks",
               "grader.batch", "grader.batch_state", "grader.class_folder", "grader.gradescope",
               "grader.edition", "grader.scaffold", "grader.figures", "rich.progress")
# typer 0.29 and later validate through pydantic: outside pyproject.toml's range.
PYDANTIC = () if any(Requirement(r).name == "pydantic" for r in importlib.metadata.requires("typer") or ()) \
    else ("pydantic", "pydantic_core")


def imported(tmp_path, *args: str, torch_first: bool = False) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The command's run, and the modules it imported (less torch's own, with ``torch_first``)."""
    out = tmp_path / "modules.txt"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(out), *args], capture_output=True, text=True, check=False,
                          cwd=COURSE_ROOT, timeout=300,
                          env={**os.environ, "COLUMNS": "200", "TORCH_FIRST": "1" if torch_first else ""})
    torchs = set(out.with_suffix(".txt.torch").read_text().split()) - {"torch"} if torch_first else set()
    return done, set(out.read_text().split()) - torchs


def among(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == name or m.startswith(name + ".") for name in names))


def test_a_grade_imports_only_what_it_uses(tmp_path):
    done, modules = imported(tmp_path, "grade", "ch01", "--solutions", "--seed", "0", torch_first=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {"torch", "grader.grading", "grader.report"} <= modules  # it did grade
    assert among(modules, (*INSTRUCTORS, "grader.watching", "sympy", "nbformat", *PYDANTIC)) == []


@pytest.mark.parametrize("args", [["list"], ["grade", "--seed", "soon"]])
def test_list_and_a_usage_error_import_no_torch_and_no_instructors_command(tmp_path, args):
    done, modules = imported(tmp_path, *args)
    assert done.returncode == (0 if args == ["list"] else 2), done.stdout + done.stderr
    assert among(modules, ("torch", "numpy", *INSTRUCTORS, *PYDANTIC)) == []


def test_help_lists_the_instructors_commands_without_importing_torch(tmp_path):
    done, modules = imported(tmp_path, "--help")
    assert done.returncode == 0
    assert re.search(r"\bverify\b", done.stdout) and "grader.instructor_commands" in modules
    assert among(modules, ("torch", "numpy", "grader.verify", "grader.build", *PYDANTIC)) == []


def test_typers_range_leaves_out_the_versions_that_import_pydantic():
    """typer 0.29 requires pydantic; 0.27 and 0.28 write the help as the
    commands expect it (``app._PlainHelp``), 0.26 another way."""
    import tomllib  # Python 3.11

    project = tomllib.loads((COURSE_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (typer,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "typer"]
    assert [v for v in ("0.26.8", "0.27.0", "0.28.0", "0.29.0", "0.30.0") if typer.specifier.contains(v)] == [
        "0.27.0", "0.28.0"]
