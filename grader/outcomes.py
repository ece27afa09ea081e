"""The words a grade is made of: how a check failed, where an exercise stands.

Each is a ``str`` as well as an enum member: ``Status.PASSED == "passed"``,
and JSON, tables and f-strings show the word itself. A misspelt word is an
error where it is made (``Failure("mismatched")`` raises ValueError) rather
than a verdict that silently matches nothing.
"""

from __future__ import annotations

import enum


class _Word(str, enum.Enum):
    """An enum whose members are their words (``enum.StrEnum`` from Python 3.11)."""

    def __str__(self) -> str:
        return self.value


class Failure(_Word):
    """What sort of failure a check met (``CheckFailure.kind``): how a
    report sums up an exercise, and which hints may apply."""

    MISMATCH = "mismatch"  # a value came back, and it is wrong
    ERROR = "error"  # the student's code raised
    NOT_IMPLEMENTED = "not-implemented"  # it raised NotImplementedError: the stub, untouched
    MISSING = "missing"  # the file defines no such function or class
    UNREADABLE = "unreadable"  # the file could not be read or run at all
    FORBIDDEN = "forbidden"  # it calls what the exercise asks to write
    DEVICE = "device"  # it would fail, or answer on the CPU, on a GPU
    TIMEOUT = "timeout"  # over the check's or the exercise's time limit
    MEMORY = "memory"  # over the memory limit
    CRASH = "crash"  # the worker died (a segmentation fault, a signal)
    EXIT = "exit"  # the student's code called exit()
    PROTOCOL = "protocol"  # the worker sent back something that is not an answer
    GRADER_ERROR = "grader-error"  # the check itself broke: a bug of the course


class Status(_Word):
    """Where an exercise stands after its checks (``ExerciseResult.status``)."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_IMPLEMENTED = "not implemented"  # every check met the untouched stub
    MISSING = "missing"  # the file has no such function
    NOT_ATTEMPTED = "not attempted"  # an optional exercise left alone: no points, no failure

    @property
    def counts_as_passed(self) -> bool:
        """Whether a report counts it among the passed (an optional exercise
        left alone failed nothing)."""
        return self in (Status.PASSED, Status.NOT_ATTEMPTED)
