"""Notebooks: built from the single source, graded exactly like the .py files,
and robust to the ways students edit them."""

import copy
import json
import os
import re
import subprocess
import sys

import nbformat
import pytest

from conftest import FAST, limits_for, result_of, statuses
from grader.build import solution_notebooks
from grader.catalog import CHAPTERS, COURSE_ROOT, find_chapter
from grader.grading import grade
from grader.loading import load_submission
from grader.notebooks import EXERCISE, GRADE, NOT_GRADED, SETUP, TRY, notebook_code

CH01 = find_chapter("ch01")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def tags(cell) -> set[str]:
    return set(cell.metadata.get("tags", ()))


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """The solution-filled notebooks, written by the instructors' build."""
    folder = tmp_path_factory.mktemp("solved")
    for path, text in solution_notebooks(folder).items():  # the figures too, in folders
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return folder


def read(path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def exercise_cell(notebook, name: str) -> int:
    return next(i for i, cell in enumerate(notebook.cells)
                if EXERCISE in tags(cell) and cell.metadata["mha_course"]["exercise"] == name)


def code_cell_number(notebook, index: int) -> int:
    """The place of ``notebook.cells[index]`` among the code cells, from 1: what a
    student counts on screen, where the lesson's markdown cells are not code."""
    return sum(cell.cell_type == "code" for cell in notebook.cells[: index + 1])


def grade_notebook(notebook, tmp_path, chapter=CH01, seed=5):
    path = tmp_path / f"{chapter.module}.ipynb"
    nbformat.write(notebook, path)
    return grade([(chapter, path)], limits=limits_for([chapter]), seed=seed)


# -- what the build writes -------------------------------------------------------------


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.id for c in CHAPTERS])
def test_every_chapter_has_a_valid_notebook_with_tagged_cells(chapter):
    notebook = read(chapter.notebook())
    nbformat.validate(notebook)
    assert notebook.metadata["mha_course"]["chapter"] == chapter.id
    exercises = [cell.metadata["mha_course"]["exercise"] for cell in notebook.cells
                 if EXERCISE in tags(cell)]
    assert exercises == [exercise.name for exercise in chapter.exercises]
    tried = [cell.metadata["mha_course"]["exercise"] for cell in notebook.cells if TRY in tags(cell)]
    assert tried == exercises, "one try-it cell after each exercise"
    assert tags(notebook.cells[-1]) == {GRADE}
    assert f'check("{chapter.id}")' in notebook.cells[-1].source
    assert sum(SETUP in tags(cell) for cell in notebook.cells) == 1
    for cell in notebook.cells:  # the stub's cells say what to write and no more
        if EXERCISE in tags(cell):
            assert "raise NotImplementedError" in cell.source


def figure_links(notebook) -> list[str]:
    lesson = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", lesson)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.id for c in CHAPTERS])
def test_lesson_figures_are_linked_from_the_exercises_folder(chapter):
    notebook = read(chapter.notebook())
    figures = figure_links(notebook)
    assert figures
    for target in figures:
        assert target.startswith(f"../chapters/{chapter.folder}/figures/")
        assert (COURSE_ROOT / "exercises" / target).resolve().is_file()


def test_the_instructors_notebooks_hold_the_reference_code(solved):
    notebook = read(solved / f"{CH01.module}.ipynb")
    assert notebook.metadata["mha_course"]["edition"] == "solutions"
    code = notebook.cells[exercise_cell(notebook, "softmax")].source
    assert "NotImplementedError" not in code and "BEGIN SOLUTION" in code


def test_graded_code_leaves_out_try_plot_and_grade_cells():
    notebook = read(CH01.notebook())
    code = notebook_code(notebook).source
    for cell in notebook.cells:
        if cell.cell_type == "code" and tags(cell) & NOT_GRADED:
            assert cell.source not in code
    assert "check(" not in code


# -- graded like the .py -----------------------------------------------------------------


def test_notebooks_and_files_get_the_same_verdict_on_every_check(solved):
    files = [(chapter, chapter.solution()) for chapter in CHAPTERS]
    notebooks = [(chapter, solved / f"{chapter.module}.ipynb") for chapter in CHAPTERS]

    def verdicts(targets):
        report = grade(targets, seed=11)
        return [(r.chapter.id, r.exercise.name, c.check, c.outcome, c.kind)
                for r in report.exercises for c in r.checks]

    from_files = verdicts(files)
    assert from_files == verdicts(notebooks)
    assert {outcome for *_, outcome, _ in from_files} == {"passed"}


def test_a_failing_notebook_fails_the_same_checks_as_its_file(tmp_path):
    notebook = read(CH01.notebook())
    report = grade_notebook(notebook, tmp_path)
    assert set(statuses(report).values()) == {"not implemented"}


# -- students' edits -----------------------------------------------------------------------


def test_a_deleted_exercise_cell_costs_that_exercise_only(solved, tmp_path):
    notebook = read(solved / f"{CH01.module}.ipynb")
    del notebook.cells[exercise_cell(notebook, "softmax_numpy")]
    report = grade_notebook(notebook, tmp_path)
    result = result_of(report, "softmax_numpy")
    assert result.status == "missing"
    assert "your notebook defines no function softmax_numpy" in result.reason
    assert "exercise cell seems deleted" in result.reason
    assert statuses(report)["softmax"] == "passed"


def test_a_renamed_function_is_named_in_the_message(solved, tmp_path):
    notebook = read(solved / f"{CH01.module}.ipynb")
    cell = notebook.cells[exercise_cell(notebook, "softmax")]
    cell.source = cell.source.replace("def softmax(", "def my_softmax(")
    report = grade_notebook(notebook, tmp_path)
    result = result_of(report, "softmax")
    assert result.status == "missing"
    assert "defines my_softmax instead: keep the name softmax" in result.reason


def test_a_cell_split_inside_a_function_is_joined_back(solved, tmp_path):
    notebook = read(solved / f"{CH01.module}.ipynb")
    index = exercise_cell(notebook, "softmax")
    cell = notebook.cells[index]
    lines = cell.source.splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "BEGIN SOLUTION" in line)
    second = copy.deepcopy(cell)
    second.id = "split-second-half"
    second.metadata = {}  # Jupyter gives the new half its own metadata
    cell.source, second.source = "".join(lines[:cut]), "".join(lines[cut:])
    notebook.cells.insert(index + 1, second)
    report = grade_notebook(notebook, tmp_path)
    assert set(statuses(report).values()) == {"passed"}
    number = code_cell_number(notebook, index)
    assert any(note.startswith(f"code cells {number}+{number + 1} were graded as one cell")
               for note in report.notes["ch01"])


def test_a_syntax_error_names_the_cell_and_costs_its_exercise(solved, tmp_path):
    notebook = read(solved / f"{CH01.module}.ipynb")
    index = exercise_cell(notebook, "softmax_numpy")
    cell = notebook.cells[index]
    cell.source = cell.source.replace("def softmax_numpy(", "def softmax_numpy(((")
    report = grade_notebook(notebook, tmp_path)
    result = result_of(report, "softmax_numpy")
    assert result.status == "failed"
    assert result.reason.startswith(f"code cell {code_cell_number(notebook, index)} (softmax_numpy), line ")
    assert statuses(report)["softmax"] == "passed"


def test_a_syntax_error_is_placed_in_its_cell_by_every_message(solved, tmp_path):
    """The broken function's own verdict and a caller's ("softmax has a syntax
    error at ...", from the worker) name the same cell and line: a line of the
    code assembled from the cells is a line no cell has."""
    notebook = read(solved / f"{CH01.module}.ipynb")
    index = exercise_cell(notebook, "softmax")
    cell = notebook.cells[index]
    cell.source = cell.source.replace("    # END SOLUTION", "    x = (\n    # END SOLUTION")
    report = grade_notebook(notebook, tmp_path)
    place = f"code cell {code_cell_number(notebook, index)} (softmax), line "
    own = result_of(report, "softmax").reason
    assert own.startswith(place)
    line = own[len(place):].split(":")[0]
    assert int(line) <= len(cell.source.splitlines())
    caller = result_of(report, "scaled_dot_product_attention").reason
    assert f"softmax has a syntax error at {place}{line}, so it cannot run" in caller


def test_helper_cells_outputs_and_magics(solved, tmp_path):
    notebook = read(solved / f"{CH01.module}.ipynb")
    index = exercise_cell(notebook, "softmax")
    helper = nbformat.v4.new_code_cell("import numpy\n\n%timeit numpy.zeros(3)\n!pip install nothing\n\n"
                                       "def largest(x, dim):\n    return x.amax(dim=dim, keepdim=True)")
    notebook.cells.insert(index, helper)  # a student's own cell, untagged, before the exercise
    cell = notebook.cells[index + 1]
    cell.source = cell.source.replace("x.amax(dim=dim, keepdim=True)", "largest(x, dim)")
    assert "largest(x, dim)" in cell.source
    cell.outputs = [nbformat.v4.new_output("stream", text="tensor([0.1, 0.9])\n")]
    cell.execution_count = 7
    report = grade_notebook(notebook, tmp_path)
    assert set(statuses(report).values()) == {"passed"}
    notes = report.notes["ch01"]
    assert any(note.startswith(f"code cell {code_cell_number(notebook, index)} (import numpy ...), line 3: "
                               "skipped the IPython line '%timeit") for note in notes)
    assert any("'!pip install nothing'" in note for note in notes)


def test_a_broken_cell_is_named_by_its_place_among_code_cells_and_its_first_line(tmp_path):
    """Jupyter shows no cell numbers, and the lesson's markdown cells are not code: a
    message names the code cell's place and what the student sees in it."""
    notebook = read(CH01.notebook())
    index = exercise_cell(notebook, "softmax")
    helper = nbformat.v4.new_code_cell("\n# my own helper\ndef largest(x, dim:\n    return x.amax(dim)\n")
    notebook.cells.insert(index, helper)
    notebook.cells.insert(index, nbformat.v4.new_markdown_cell("My notes: a helper for softmax."))
    index += 1
    number = code_cell_number(notebook, index)
    assert sum(cell.cell_type == "markdown" for cell in notebook.cells[:index]) > 1
    assert number < index + 1  # the markdown cells before it are not counted
    path = tmp_path / f"{CH01.module}.ipynb"
    nbformat.write(notebook, path)
    (problem,) = load_submission(path, CH01.module).problems
    assert str(problem).startswith(f"code cell {number} (# my own helper ...), line 3: syntax error")
    assert f"cell {index + 1}" not in str(problem)


def test_a_refused_call_names_the_exercise_cell_among_code_cells(solved, tmp_path):
    notebook = read(solved / f"{CH01.module}.ipynb")
    index = exercise_cell(notebook, "softmax")
    cell = notebook.cells[index]
    cell.source = re.sub(r"# BEGIN SOLUTION\n(.*\n)*?\s*# END SOLUTION",
                         "return torch.softmax(x, dim)", cell.source)
    assert "return torch.softmax(x, dim)" in cell.source
    line = cell.source.splitlines().index("    return torch.softmax(x, dim)") + 1
    result = result_of(grade_notebook(notebook, tmp_path), "softmax")
    assert result.status == "failed"
    assert (f"calls torch.softmax (its kernel aten::_softmax) at code cell {code_cell_number(notebook, index)} "
            f"(softmax), line {line} (return torch.softmax(x, dim)), which this exercise asks you to write "
            "yourself") in result.reason


def test_a_check_call_left_in_a_graded_cell_does_not_grade_again(solved, tmp_path):
    notebook = read(solved / f"{CH01.module}.ipynb")
    notebook.cells.insert(3, nbformat.v4.new_code_cell('from grader import check\ncheck("ch01")'))
    report = grade_notebook(notebook, tmp_path)
    assert set(statuses(report).values()) == {"passed"}
    assert report.seconds < 30


def test_a_notebook_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    """A notebook passed through a Windows editor may start with UTF-8's byte-order mark."""
    path = tmp_path / f"{CH01.module}.ipynb"
    path.write_bytes(b"\xef\xbb\xbf" + CH01.notebook().read_bytes())
    assert load_submission(path, CH01.module).source == load_submission(CH01.notebook(), CH01.module).source


@pytest.mark.parametrize("text, message", [
    ('{"cells": [', "is not valid notebook JSON (line 1"),
    ("", "is empty: save the notebook"),
    ('{"nbformat": 5, "nbformat_minor": 0, "cells": [], "metadata": {}}', "notebook format 5"),
    ('{"hello": "world"}', "is JSON but not a Jupyter notebook"),
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code"}]}',
     "could not be read as a notebook"),
], ids=["truncated", "empty", "future-version", "not-a-notebook", "invalid-cell"])
def test_a_corrupt_notebook_fails_every_exercise_with_one_line(tmp_path, text, message):
    path = tmp_path / f"{CH01.module}.ipynb"
    path.write_text(text, encoding="utf-8")
    report = grade([(CH01, path)], limits=FAST, seed=1)
    for result in report.exercises:
        assert result.status == "failed"
        assert message in result.reason and "\n" not in result.reason


def test_the_command_line_grades_a_notebook_and_says_a_corrupt_one_in_a_line(tmp_path, solved):
    from test_cli import mha_course

    good = mha_course("grade", str(solved / f"{CH01.module}.ipynb"), "--seed", "3")
    assert good.returncode == 0, good.stderr
    assert f"Total: {CH01.points} / {CH01.points} points" in good.stdout
    broken = tmp_path / f"{CH01.module}.ipynb"
    broken.write_text(json.dumps({"cells": "oops"}), encoding="utf-8")
    bad = mha_course("grade", str(broken))
    assert bad.returncode == 1
    assert "Traceback" not in bad.stdout + bad.stderr


def test_a_chapter_target_takes_the_file_saved_last(tmp_path, solved):
    from grader.finding import chapter_file

    py = tmp_path / CH01.file_name
    notebook = tmp_path / f"{CH01.module}.ipynb"
    py.write_text("", encoding="utf-8")
    notebook.write_text((solved / notebook.name).read_text(encoding="utf-8"), encoding="utf-8")
    os.utime(py, (1_000_000, 1_000_000))
    assert chapter_file(CH01, tmp_path) == notebook
    os.utime(notebook, (900_000, 900_000))
    assert chapter_file(CH01, tmp_path) == py


def test_a_stub_that_autosave_touched_loses_to_the_file_with_work(tmp_path):
    py = tmp_path / CH01.file_name
    notebook = tmp_path / f"{CH01.module}.ipynb"
    py.write_text((COURSE_ROOT / "solutions" / py.name).read_text(encoding="utf-8"), encoding="utf-8")
    notebook.write_text((COURSE_ROOT / "exercises" / notebook.name).read_text(encoding="utf-8"),
                        encoding="utf-8")
    os.utime(py, (1_000_000, 1_000_000))  # Jupyter saved the untouched notebook after the work
    done = subprocess.run([sys.executable, "-m", "grader", "grade", "ch01", "--dir", str(tmp_path), "--json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    results = json.loads(done.stdout)
    assert results["score"] == results["max_score"] == CH01.points
    assert results["output"].splitlines()[0] == (
        f"ch01: graded {py.name} (it has more written than {notebook.name})")
    table = subprocess.run([sys.executable, "-m", "grader", "grade", "ch01", "--dir", str(tmp_path)],
                           capture_output=True, text=True, cwd=COURSE_ROOT, timeout=300,
                           env={**os.environ, "COLUMNS": "200"})
    assert f"graded: {py} (it has more written than {notebook.name})" in table.stdout


# -- in Jupyter ----------------------------------------------------------------------------

# Run before each notebook in the shared kernel (``Kernel``), to make its namespace
# what a fresh kernel's is: no name that a notebook run before it defined (a notebook
# that forgot an import still fails), and the notebook's own folder as the working
# directory (check() looks for the saved notebook there). It leaves no name of its own.
FRESH_NAMESPACE = """
get_ipython().reset(new_session=True)
__import__("os").chdir({folder!r})
"""


class Kernel:
    """One Jupyter kernel that runs the notebooks of this file's tests one
    after another, each in a namespace emptied first and in its own folder.

    Why shared: a kernel costs seconds to start and to shut down, and each
    notebook's first cell imports torch, a few seconds more; with one kernel a
    notebook, these were most of this file's time. What the tests assert
    stays what a fresh kernel shows: no name from an earlier notebook is left
    (``FRESH_NAMESPACE``), the grading cell's check() grades in a process of its
    own as always, and a notebook that changes the kernel's modules (a patched
    torch.allclose) runs with ``changes_modules`` and takes the kernel with it:
    the next notebook starts a new one."""

    def __init__(self):
        self.manager = None  # started by the first notebook run, with that notebook's client

    def run(self, path, allow_errors: bool, changes_modules: bool = False) -> nbformat.NotebookNode:
        """Run a notebook top to bottom in the kernel, in its own folder. An
        error in a try or plot cell does not stop it (their tag says so, as it
        does for Run All in JupyterLab), so without ``allow_errors`` no cell may
        show one."""
        nbclient = pytest.importorskip("nbclient")
        if self.manager is None:
            self.manager = nbclient.NotebookClient(nbformat.v4.new_notebook(),
                                                   kernel_name="python3").create_kernel_manager()
        try:
            fresh = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
                FRESH_NAMESPACE.format(folder=str(path.parent)))])
            self._execute(fresh, path.parent, allow_errors=False)
            notebook = self._execute(read(path), path.parent, allow_errors)
        except nbclient.exceptions.CellExecutionError:
            if changes_modules:
                self.stop()
            raise  # a cell's error: the kernel itself is fine
        except BaseException:
            self.stop()  # dead, or still busy after a timeout: the next notebook gets a new kernel
            raise
        if changes_modules:
            self.stop()
        if not allow_errors:
            assert not [output for cell in notebook.cells for output in cell.get("outputs", ())
                        if output.output_type == "error"]
        return notebook

    def _execute(self, notebook, folder, allow_errors: bool) -> nbformat.NotebookNode:
        import nbclient

        client = nbclient.NotebookClient(notebook, km=self.manager, timeout=300, kernel_name="python3",
                                         allow_errors=allow_errors,
                                         resources={"metadata": {"path": str(folder)}})
        # The kernel runs in the notebook's folder: put this tree first on its path, so that
        # check() grades with this tree's grader, not with another checkout installed in
        # editable mode (a git worktree, say). The environment is read where a notebook
        # starts the kernel (the first, or the first after ``stop``): the same for all.
        paths = [str(COURSE_ROOT), os.environ.get("PYTHONPATH", "")]
        try:
            return client.execute(env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)})
        finally:
            if client.kc is not None:  # the kernel is not the client's to stop; its channels are
                client.kc.stop_channels()

    def stop(self) -> None:
        if self.manager is not None:
            from nbclient.util import run_sync

            manager, self.manager = self.manager, None
            if manager.has_kernel:
                run_sync(manager.shutdown_kernel)(now=True)


@pytest.fixture(scope="module")
def kernel():
    """The one kernel this file's notebooks run in (``Kernel``)."""
    shared = Kernel()
    yield shared
    shared.stop()


def grading_output(notebook) -> str:
    """The grading cell's printed report; it shows nothing else, no ``Out[n]:``."""
    cell = notebook.cells[-1]
    assert GRADE in tags(cell)
    assert [output.output_type for output in cell.outputs if output.output_type != "stream"] == []
    return ANSI.sub("", "".join(output.get("text", "") for output in cell.outputs))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.id for c in CHAPTERS])
def test_a_solved_notebook_runs_top_to_bottom_and_grades_full_marks(kernel, solved, chapter):
    """Every cell of the solved notebook runs, none shows an error, and the
    grading cell prints full marks."""
    notebook = kernel.run(solved / f"{chapter.module}.ipynb", allow_errors=False)
    assert f"Total: {chapter.points} / {chapter.points} points" in grading_output(notebook)


def test_the_stub_notebook_runs_in_jupyter_and_grades_zero(kernel, tmp_path):
    """The untouched stub runs top to bottom with no cell showing an error, and
    its grading cell prints zero points and no ``Out[n]:``."""
    path = tmp_path / f"{CH01.module}.ipynb"
    path.write_text((COURSE_ROOT / "exercises" / path.name).read_text(encoding="utf-8"), encoding="utf-8")
    notebook = kernel.run(path, allow_errors=False)  # the try-it cells say "Not written yet" and go on
    assert f"Total: 0 / {CH01.points} points" in grading_output(notebook)
    # check() returns nothing, so Jupyter shows no stray `Out[n]: 1` under the table.
    assert not any(output.output_type == "execute_result" for output in notebook.cells[-1].outputs)


RUN_ALL = """
import json, sys, traceback
failed = False
for path in sys.argv[1:]:
    print("== notebook", path, flush=True)
    cells = [cell for cell in json.load(open(path, encoding="utf-8"))["cells"] if cell["cell_type"] == "code"]
    namespace = {"__name__": "__main__"}
    try:
        for number, cell in enumerate(cells, start=1):
            print(f"-- code cell {number}: {cell['metadata'].get('tags')}", flush=True)
            exec(compile("".join(cell["source"]), f"{path}, code cell {number}", "exec"), namespace)
    except BaseException:  # Run All stops this notebook here; the next notebook still runs
        traceback.print_exc(file=sys.stdout)
        failed = True
        continue
    print("reached the end of", path, flush=True)
sys.exit(1 if failed else 0)
"""


class RunAll:
    """What ``RUN_ALL`` printed for each notebook, and how its process ended."""

    def __init__(self, finished: subprocess.CompletedProcess):
        self.finished = finished
        self.output: dict[str, str] = {}
        path = None
        for line in finished.stdout.splitlines(keepends=True):
            if line.startswith("== notebook "):
                path = line[len("== notebook "):].rstrip("\n")
            if path is not None:
                self.output[path] = self.output.get(path, "") + line

    def assert_reached_the_end(self, paths: list[str]) -> None:
        """Each of ``paths`` ran to its last cell, and the process ended well
        but for a notebook another test names."""
        for path in paths:
            assert f"reached the end of {path}" in self.output.get(path, ""), (
                self.output.get(path, "")[-3000:] + self.finished.stderr[-3000:])
        others = [path for path, output in self.output.items()
                  if path not in paths and f"reached the end of {path}" not in output]
        assert self.finished.returncode == 0 or others, self.finished.stderr[-3000:]


STUB_NOTEBOOKS = [str(chapter.notebook()) for chapter in CHAPTERS]


def notebooks_with_one_exercise_unwritten(solved, folder) -> list[str]:
    """For each exercise of the course, its chapter's solved notebook with that
    exercise's cell put back as the stub has it."""
    paths = []
    for chapter in CHAPTERS:
        stub = read(chapter.notebook())
        for exercise in chapter.exercises:
            notebook = read(solved / f"{chapter.module}.ipynb")
            at = exercise_cell(notebook, exercise.name)
            notebook.cells[at].source = stub.cells[exercise_cell(stub, exercise.name)].source
            path = folder / f"{chapter.id}_without_{exercise.name}.ipynb"
            nbformat.write(notebook, path)
            paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def run_all(solved, tmp_path_factory) -> tuple[RunAll, list[str]]:
    """Every code cell of each notebook, in order, as Run All does, with
    check() returning at once (as in a worker): the stub notebooks, then the
    solved ones with one exercise unwritten (their paths are returned too).
    Shared: one process runs both tests' notebooks, each in a namespace of its
    own as before, which saves a Python start and a torch import; a notebook
    that raises stops there and the next one runs, so that each test sees its
    own notebooks' ends."""
    unwritten = notebooks_with_one_exercise_unwritten(solved, tmp_path_factory.mktemp("unwritten"))
    finished = subprocess.run([sys.executable, "-c", RUN_ALL, *STUB_NOTEBOOKS, *unwritten],
                              capture_output=True, text=True, cwd=COURSE_ROOT / "exercises", timeout=600,
                              env={**os.environ, "PYTHONPATH": str(COURSE_ROOT), "MHA_COURSE_WORKER": "1"})
    return RunAll(finished), unwritten


def test_run_all_on_the_stub_notebooks_reaches_the_grading_cell(run_all):
    """Run All stops at the first cell that raises: in a stub, each try-it and
    plot cell says in a line that what it calls is not written yet, and the
    last cell, which grades, runs. The code cells run in order in one
    namespace, as a kernel runs them; check() returns at once here (as in a
    worker), since grading the stubs is tested elsewhere."""
    ran, _ = run_all
    ran.assert_reached_the_end(STUB_NOTEBOOKS)
    tried = sum(TRY in tags(cell) or "plot" in tags(cell) for chapter in CHAPTERS
                for cell in read(chapter.notebook()).cells)
    said = sum(ran.output[path].count("Not written yet") + ran.output[path].count("Not drawn yet")
               for path in STUB_NOTEBOOKS)
    assert said == tried


def test_check_returns_nothing_for_jupyter_to_show(tmp_path, capsys):
    from grader.notebook_check import check

    path = tmp_path / f"{CH01.module}.ipynb"
    path.write_text("", encoding="utf-8")  # graded in a second: every exercise fails
    assert check("ch01", notebook=path) is None
    assert "is empty: save the notebook" in capsys.readouterr().out


def test_check_grades_the_saved_file_not_the_kernels_objects(kernel, tmp_path):
    """A kernel that patched torch.allclose and defined a working softmax by
    hand still gets the verdict of the saved notebook, a stub."""
    stub = read(CH01.notebook())
    path = tmp_path / f"{CH01.module}.ipynb"
    nbformat.write(stub, path)
    live = copy.deepcopy(stub)
    live.cells[exercise_cell(live, "softmax")].source = (
        "import torch\ntorch.allclose = lambda *a, **k: True\n"
        "def softmax(x, dim=-1):\n    return torch.softmax(x, dim)")
    live.cells = [cell for cell in live.cells if not tags(cell) & {TRY, "plot"}]
    nbformat.write(live, tmp_path / "live.ipynb")
    # It patches torch.allclose in the kernel: no later notebook may run there.
    notebook = kernel.run(tmp_path / "live.ipynb", allow_errors=True, changes_modules=True)
    # The grading cell of live.ipynb calls check("ch01"): it finds the saved stub.
    assert f"Total: 0 / {CH01.points} points" in grading_output(notebook)


def test_run_all_with_one_exercise_unwritten_reaches_the_grading_cell(run_all):
    """A student who has written every exercise but one (any one) and runs
    all cells reaches the grade: a try or plot cell that takes something
    from the unwritten one's try cell (chapter 8's trained model) says so in
    a line instead of stopping Run All on another error."""
    ran, unwritten = run_all
    assert len(unwritten) == sum(len(chapter.exercises) for chapter in CHAPTERS)
    ran.assert_reached_the_end(unwritten)
