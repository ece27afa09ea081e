"""grader/README.md names every module of the grader, and only those."""

import re

from grader.catalog import COURSE_ROOT

GRADER = COURSE_ROOT / "grader"
README = (GRADER / "README.md").read_text(encoding="utf-8")


def _named(text: str) -> set[str]:
    """What a README names in backquotes: ``cli.py``, ``bugs/``, ``templates/setup.sh``."""
    return set(re.findall(r"`([\w/.]+?(?:\.py|/|\.sh|run_autograder))`", text))


def _modules() -> set[str]:
    """The grader's modules, and its packages as folders (a package's own
    modules are named by the pattern the README gives, ``bugs/ch01.py``)."""
    found = {path.name for path in GRADER.glob("*.py")} - {"__init__.py"}
    return found | {f"{path.parent.name}/" for path in GRADER.glob("*/__init__.py")}


def _gaps(text: str) -> tuple[set[str], set[str]]:
    """The modules a README leaves out, and the names it gives that do not
    exist, in grader/ or from the project's root (``solutions/``). A pattern
    for a new chapter's file (``bugs/chNN.py``) names none."""
    named = {name for name in _named(text) if "NN" not in name}
    made_up = {name for name in named if not (GRADER / name).exists() and not (COURSE_ROOT / name).exists()}
    return _modules() - named, made_up


def test_every_module_is_named_and_every_name_exists():
    assert _gaps(README) == (set(), set())


def test_a_module_left_out_or_a_name_made_up_is_found():
    assert _gaps(README.replace("`report.py`", "report")) == ({"report.py"}, set())
    assert _gaps(README + "\n- `scheduler.py`: grades later.\n") == (set(), {"scheduler.py"})
