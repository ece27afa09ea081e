"""``check()``: grade a chapter's notebook from inside Jupyter.

The grading cell of every notebook calls ``check("chNN")``. It grades the
notebook as saved on disk, in a fresh process (``python -m grader grade``),
never this kernel's objects: whatever the notebook's cells did to the kernel
(a patched ``torch.allclose``, a variable named like an exercise) cannot
reach the verdicts. The cost is one torch import, a few seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from grader.catalog import UnknownChapter, chapter_for_file, find_chapter

WORKER_VARIABLE = "MHA_COURSE_WORKER"  # as grader.worker sets it in workers


def check(chapter: str | None = None, notebook: str | os.PathLike | None = None) -> None:
    """Grade the saved notebook of ``chapter`` (``"ch03"``) and print the table.

    Returns nothing: the printed table is the answer, and a value returned
    by the grading cell's last line would be shown under it as ``Out[n]:``.
    ``mha-course grade`` gives an exit status to scripts.

    Args:
        chapter: the chapter id; None to take it from the notebook's name.
        notebook: the notebook's path, when it cannot be found on its own
            (it is looked up from the editor, then in the current folder).
    """
    if os.environ.get(WORKER_VARIABLE):
        return  # left in graded code: the grader is already running it
    try:
        path = _find_notebook(chapter, notebook)
    except (FileNotFoundError, UnknownChapter) as error:
        print(f"check(): {error}")
        return
    saved = time.strftime("%H:%M:%S", time.localtime(path.stat().st_mtime))
    print(f"Grading {path.name} as saved at {saved} (save the notebook first if you changed it).")
    environment = {**os.environ, "FORCE_COLOR": "1", "COLUMNS": "100", "TERM": "xterm-256color"}
    finished = subprocess.run([sys.executable, "-m", "grader", "grade", str(path)],
                              capture_output=True, text=True, env=environment, check=False)
    print(finished.stdout, end="")
    if finished.stderr.strip():
        print(finished.stderr, end="", file=sys.stderr)


def _find_notebook(chapter: str | None, notebook: str | os.PathLike | None) -> Path:
    if notebook is not None:
        path = Path(notebook)
        if not path.is_file():
            raise FileNotFoundError(f"no notebook {path}")
        return path
    wanted = find_chapter(chapter) if chapter else None
    for candidate in _editor_notebooks():
        if candidate.is_file() and (wanted is None or chapter_for_file(candidate) == wanted):
            return candidate
    if wanted is None:
        raise FileNotFoundError('cannot tell which notebook this is: call check("ch01"), or '
                                'check(notebook="path/to/ch01_self_attention.ipynb")')
    path = Path.cwd() / f"{wanted.module}.ipynb"
    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} in {Path.cwd()}: call "
                                f'check("{wanted.id}", notebook="path/to/{path.name}")')
    return path


def _editor_notebooks() -> list[Path]:
    """The notebook this kernel runs, where the editor says: VS Code puts it
    in the namespace, Jupyter Server in JPY_SESSION_NAME."""
    found = []
    try:
        from IPython import get_ipython
    except ImportError:
        get_ipython = None
    shell = get_ipython() if get_ipython else None
    if shell is not None and isinstance(shell.user_ns.get("__vsc_ipynb_file__"), str):
        found.append(Path(shell.user_ns["__vsc_ipynb_file__"]))
    session = os.environ.get("JPY_SESSION_NAME", "")
    if session.endswith(".ipynb"):
        found.append(Path(session))
    return found
