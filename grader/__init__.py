"""mha-course: the course's autograder.

Read top-down: ``cli`` (commands) -> ``catalog`` (what exists) -> ``loading``
(turn a file or a notebook into statements) -> ``sandbox`` (run them in a
worker process) -> ``checks/`` (judge what comes back) -> ``report`` (show
the verdicts). ``check()`` is the notebooks' way in.
"""

__version__ = "0.1.0"


def check(chapter: str | None = None, notebook=None) -> None:
    """Grade a chapter's saved notebook from inside Jupyter (see
    ``grader.notebook_check``); imported lazily, so ``import grader`` stays cheap."""
    from grader.notebook_check import check as grade_notebook

    grade_notebook(chapter, notebook)
