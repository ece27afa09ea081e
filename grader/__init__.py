"""mha-course: the course's autograder.

Read top-down: ``cli`` (commands) -> ``catalog`` (what exists) -> ``loading``
(turn a file into statements) -> ``sandbox`` (run them in a worker process)
-> ``checks/`` (judge what comes back) -> ``report`` (show the verdicts).
"""

__version__ = "0.1.0"
