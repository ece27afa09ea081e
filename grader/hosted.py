"""One submission graded inside a hosted autograder's container: what
Gradescope's ``run_autograder`` and PrairieLearn's entry point share.

Both platforms start a fresh container for each submission, put the
student's files in one folder and read one JSON file back. ``grade_folder``
grades that folder as ``mha-course grade`` grades files, with the same
sandbox, and each platform's module words the verdict in its own schema
(``gradescope.py``, ``prairielearn.py``), writing it with ``write_results``
last, after every process that ran student code has stopped. The
submission's code cannot forge it:

- student code runs only in workers, whose fork servers come from a copy
  of this process forked before it read any check, reference or known bug
  (``sandbox.clean_parent``): no worker holds them in its memory;
- it adopts the orphans of its workers (``PR_SET_CHILD_SUBREAPER``, which
  the platform's entry point sets first) and kills them before writing, so
  a process a submission forked cannot overwrite the verdict afterwards;
- run as root (as both platforms run their containers), every worker first
  becomes an unprivileged account the image has (``worker_account``): it can
  then write neither the results nor the grader's files, nor read the
  course's secrets (``SECRETS``, made unreadable to others by the
  platform's script), nor signal this process.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from grader import reaping
from grader.catalog import Chapter
from grader.finding import Found, find_chapters

STUDENT_USER = "mha-student"  # the account each platform's image or setup creates for student code

# The platforms' scripts and the Dockerfile are templates in grader/templates/,
# where a shell linter and an editor can see them. Their placeholders are
# @NAME@, not $NAME or {name}: both are full of shell variables and braces.
TEMPLATES = Path(__file__).resolve().parent / "templates"

# What only root may read in a container, relative to the course's folder:
# the reference, and every chapter's checks, known bugs and oracles, with
# what the chapters' checks and oracles share. The platforms' scripts take
# this list (their @SECRETS@ placeholder).
SECRETS = ("solutions", "grader/chapters", "grader/checks.py", "grader/oracles.py")


def filled(template: str, values: dict[str, str]) -> str:
    """The template named ``template`` in ``TEMPLATES``, each placeholder
    (``@NAME@``, a key of ``values``) replaced by its value."""
    text = (TEMPLATES / template).read_text(encoding="utf-8")
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return text


def missing_solutions(chapters: Sequence[Chapter], root: Path) -> list[str]:
    """``solutions/chNN_topic.py`` of each of ``chapters`` that ``root``
    lacks: a platform's grader grades against them, so its files are made
    from the instructor's tree only."""
    return [f"solutions/{chapter.module}.py" for chapter in chapters if not chapter.solution(root).is_file()]


@dataclass
class Hosted:
    """What grading a hosted submission found and gave.

    Attributes:
        found: which file of each chapter was graded, and why
            (``finding.find_chapters``).
        report: the ``GradeReport`` (None: no chapter file was found).
        seed: the seed of the random inputs.
        seconds: wall time, from the start to the report.
    """

    found: Found
    report: object | None
    seed: int
    seconds: float


def grade_folder(submission: Path, chapters: Sequence[Chapter], timeout: float = 10.0,
                 student_user: str = STUDENT_USER, log: Callable[[str], None] = print,
                 seed: int | None = None, found: Found | None = None) -> Hosted:
    """Grade the chapter files found in ``submission`` (a folder; it may not
    exist) with each check limited to ``timeout`` seconds of CPU; student
    code runs as ``student_user`` when this process is root. ``found``: what
    ``find_chapters`` found there, when the caller has looked already.
    Returns once every process the grade started has stopped."""
    started = time.perf_counter()
    seed = secrets.randbelow(2**31) if seed is None else seed
    if found is None:
        found = find_chapters(submission, chapters) if submission.is_dir() else Found()
    report = None
    if found.chosen:
        # Everything the verdict needs is imported before any student code
        # runs, torch included: workers fork from a warm process. That
        # process, the clean parent, is forked before the grading modules are
        # imported: no worker holds what they read (checks, reference, bugs).
        import torch

        from grader.isolation import missing
        from grader.sandbox import Limits, clean_parent, layers
        from grader.side_by_side import default_processes

        processes = min(default_processes(), len(found.chosen))
        work = Path(tempfile.mkdtemp(prefix="mha-course-"))
        try:
            with clean_parent(processes):
                import grader.report  # noqa: F401 - the platforms word the report after the workers
                from grader.grading import grade

                # The files under their exercise names, side by side in a folder
                # of their own: a chapter may import an earlier chapter's file.
                targets = []
                for chapter in chapters:
                    if chapter.id in found.chosen:
                        source = found.chosen[chapter.id]
                        copy = work / f"{chapter.module}{source.suffix}"
                        shutil.copyfile(source, copy)
                        targets.append((chapter, copy))
                # Workers read a copy of these (the sandbox stages them) and write a
                # scratch folder of their own: this folder stays root's.
                account, line = worker_account(student_user)
                if line:
                    log(line)
                log(missing(layers()) or "sandbox: Landlock, seccomp and rlimits in every worker")
                limits = Limits.per_check(timeout)
                report = grade(targets, torch.device("cpu"), limits, seed, jobs=processes, account=account)
                report.sources = found.sources()  # named as the student knows them, not as copied
                seed = report.seed  # the one grading used (an edition picks a recorded one)
        finally:
            stopped = reaping.stop_descendants()
            if stopped:
                log(f"stopped {stopped} process(es) the submission left running")
            shutil.rmtree(work, ignore_errors=True)
    return Hosted(found, report, seed, time.perf_counter() - started)


# -- keeping student code in its place ------------------------------------------------


def worker_account(user: str) -> tuple[tuple[int, int] | None, str]:
    """The account the workers run as: ``user``'s ``(uid, gid)`` when this
    process is root and that account can run Python, else None (this
    process's own); and a line for the log ("" when this process is not root).

    A worker changes user before it runs any student statement; one that
    cannot ends at once instead of going on as root (``sandbox.fork_server``).
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None, ""
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        return None, f"warning: student code runs as root: no account {user!r} (the image's setup creates it)"
    uid, gid = account.pw_uid, account.pw_gid
    if not can_run_python(uid, gid):
        return None, (f"warning: student code runs as root: {user} cannot read Python's or "
                      "torch's files, which workers may import from")
    return (uid, gid), f"student code runs as {user}"


def can_run_python(uid: int, gid: int) -> bool:
    """Whether the account can list the folders of Python's standard library
    and of torch: a worker imports from them lazily (a codec, a submodule),
    and one that cannot would fail every exercise. (Python installed under
    a private home folder, as pyenv does, fails this.)"""
    import torch

    folders = [os.path.dirname(os.__file__), os.path.dirname(torch.__file__)]
    pid = os.fork()
    if pid == 0:  # the probe: become the account, look, report by exit status
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            for folder in folders:
                os.listdir(folder)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


# -- the results file -----------------------------------------------------------------


def write_results(path: Path, results: dict) -> None:
    """Write ``results`` to ``path`` whatever a submission put there: the
    JSON goes to a fresh file beside it, renamed over the old path (a file,
    or a link, which is replaced and not followed); a folder is removed."""
    folder = path.parent
    if folder.is_symlink():
        folder.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".results-", suffix=".json")
    with os.fdopen(handle, "w", encoding="utf-8") as file:
        json.dump(results, file, indent=2)
        file.write("\n")
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
