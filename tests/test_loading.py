"""Reading a submission never runs it, and a syntax error costs only its block."""

from pathlib import Path

import pytest

from conftest import CH01, SOLUTION, statuses
from grader.loading import SubmissionError, load_submission, parse_with_repairs


def test_a_clean_file_parses_without_problems():
    tree, problems = parse_with_repairs("def f(x):\n    return x\n", "f.py")
    assert problems == [] and len(tree.body) == 1


def test_each_broken_function_is_blanked_and_named():
    source = (
        "import math\n"
        "\n"
        "def broken(x):\n"
        "    return (x\n"
        "\n"
        "def fine(x):\n"
        "    return x\n"
        "\n"
        "@decorated\n"
        "def also_broken(x)\n"
        "    return x\n"
    )
    tree, problems = parse_with_repairs(source, "f.py")
    assert [p.name for p in problems] == ["broken", "also_broken"]
    assert [p.line for p in problems] == [4, 10]
    names = [getattr(node, "name", None) for node in tree.body]
    assert names == [None, "fine"]  # the import and the one good function survive
    assert tree.body[1].lineno == 6  # line numbers are the student's


def test_a_broken_top_level_statement_is_a_problem_without_a_name():
    _, problems = parse_with_repairs("x = (1,\ndef f():\n    return 1\n", "f.py")
    assert problems and problems[0].name is None


def test_statements_that_parse_but_do_not_compile_are_problems(tmp_path: Path):
    path = tmp_path / "f.py"
    path.write_text("def f():\n    return 1\nreturn 2\n")
    submission = load_submission(path, "f")
    assert [line for line, _, _ in submission.statements] == [1]
    assert "'return' outside function" in str(submission.problems[0])


def test_future_imports_apply_to_every_statement(tmp_path: Path):
    path = tmp_path / "f.py"
    path.write_text("from __future__ import annotations\ndef f(x: Undefined) -> Missing:\n    return x\n")
    submission = load_submission(path, "f")
    namespace = {}
    for _, code, _ in submission.statements:
        exec(code, namespace)  # would raise NameError without the future flag
    assert namespace["f"](3) == 3


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe\x00bad", "is not UTF-8"),
    (b"x = 1\x00\n", "null bytes"),
])
def test_unreadable_files_are_submission_errors(tmp_path: Path, content, message):
    path = tmp_path / "f.py"
    path.write_bytes(content)
    with pytest.raises(SubmissionError, match=message):
        load_submission(path, "f")


def test_a_missing_file_is_a_submission_error(tmp_path: Path):
    with pytest.raises(SubmissionError, match="cannot read"):
        load_submission(tmp_path / "gone.py", "f")


BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark, which some Windows editors write first


@pytest.mark.parametrize("encoded", [
    BOM + b"import math\r\n\r\ndef root(x):\r\n\treturn math.sqrt(x)\r\n",
    b"# -*- coding: latin-1 -*-\nimport math\n\ndef root(x):\n    return math.sqrt(x)  # \xe9\n",
], ids=["bom-crlf-tabs", "latin-1-coding-line"])
def test_a_file_is_read_as_python_reads_it(tmp_path: Path, encoded):
    """A byte-order mark or a coding line is part of how Python reads a file:
    the grader reads it the same way, not as a syntax error on line 1."""
    path = tmp_path / "f.py"
    path.write_bytes(encoded)
    namespace = {}
    exec(compile(encoded, "f.py", "exec"), namespace)  # Python reads it
    submission = load_submission(path, "f")
    assert submission.problems == []
    assert [line for line, _, _ in submission.statements] == [encoded.count(b"\n", 0, encoded.index(b"import")) + 1,
                                                             encoded.count(b"\n", 0, encoded.index(b"def")) + 1]
    assert not submission.source.startswith("\ufeff")


def test_a_solution_saved_with_a_byte_order_mark_and_crlf_grades_full_marks(grade_source):
    report = grade_source("\ufeff" + SOLUTION.replace("\n", "\r\n"))
    assert report.notes == {}
    assert set(statuses(report).values()) == {"passed"}


HELPER = "def stable_max(x, dim):\n    return x.amax(dim=dim, keepdim=True)\n"


def test_a_local_module_the_file_imports_is_named_once_as_not_graded(tmp_path: Path):
    """A submission is one file (what batch and Gradescope receive): a module
    of the student's own beside it is not graded with it, and the report says
    so once, at the top, naming it."""
    (tmp_path / "attention_helpers.py").write_text(HELPER, encoding="utf-8")
    (tmp_path / "ch02_cross_attention.py").write_text("", encoding="utf-8")  # a chapter: graded beside it
    path = tmp_path / CH01.file_name
    path.write_text("import math\nimport attention_helpers\nfrom ch02_cross_attention import *\n\n"
                    "def f(x):\n    from attention_helpers import stable_max\n    return stable_max(x, -1)\n\n"
                    "if __name__ == '__main__':\n    import my_tests\n", encoding="utf-8")
    (tmp_path / "my_tests.py").write_text("", encoding="utf-8")  # imported where the grader never runs
    assert load_submission(path, CH01.module).notes == [
        f"only {CH01.file_name} is graded, not attention_helpers.py beside it, which it imports at line 2: "
        f"a submission is one file, as batch and Gradescope receive it; copy what you use of it into "
        f"{CH01.file_name}"]


def test_a_local_module_is_noted_at_the_top_of_the_report_and_nowhere_else(grade_source, tmp_path: Path):
    (tmp_path / "attention_helpers.py").write_text(HELPER, encoding="utf-8")
    source = "from attention_helpers import stable_max\n" + SOLUTION.replace(
        "x.amax(dim=dim, keepdim=True)", "stable_max(x, dim)")
    assert "stable_max(x, dim)" in source
    report = grade_source(source)
    notes = report.notes["ch01"]
    assert notes[0].startswith(f"only {CH01.file_name} is graded, not attention_helpers.py beside it")
    assert not [note for note in notes[1:] if "attention_helpers" in note]
    assert statuses(report)["softmax"] == "failed"
