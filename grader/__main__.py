"""``python -m grader`` is the same as the ``mha-course`` command."""

from grader.cli import run

run()
