"""The hidden checks: one pytest file per chapter, run by ``grader.grading``.

Each check is a test function marked with the exercise it judges and whose
docstring is the sentence a student reads. Fixtures (from
``grader.plugin``): ``submission`` (the student's module, run in a worker),
``reference`` (the reference solution), ``bugs`` (known wrong versions, for
hints) and ``inputs`` (seeded random tensors). Everything here computes on
the CPU; the worker runs the student's code on the device being graded.
"""

import pytest

exercise = pytest.mark.exercise
