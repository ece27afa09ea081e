"""An exercise's costly imports (``Exercise.preload``) are made by a copy of
the fork server while other checks run, so its workers start with them; a
clean parent imports what it is given once, for every server it forks."""

import dataclasses
import os
import signal
import sys

import pytest
import torch

from conftest import FAST
from grader import forkserver
from grader.catalog import find_chapter
from grader.loading import load_submission
from grader.remote_submission import RemoteSubmission
from grader.sandbox import fork_server

# Two submodules nothing of the grader imports: one preloaded, one never.
# Importing one sets it on its package, where a submission can see it.
PRELOADED, OTHER = "json.tool", "wsgiref.validate"

SEES_WHAT_IS_IMPORTED = '''
import json
import wsgiref

import torch


def softmax(x, dim=-1):
    return torch.tensor([float(hasattr(json, "tool")), float(hasattr(wsgiref, "validate"))])


def softmax_numpy(x, axis=-1):
    return softmax(x)
'''


@pytest.fixture
def remote(tmp_path):
    assert PRELOADED not in sys.modules and OTHER not in sys.modules
    ch01 = find_chapter("ch01")
    exercises = tuple(dataclasses.replace(exercise, forbidden=(),
                                          preload=(PRELOADED,) if exercise.name == "softmax" else ())
                      for exercise in ch01.exercises)
    chapter = dataclasses.replace(ch01, exercises=exercises)
    path = tmp_path / chapter.file_name
    path.write_text(SEES_WHAT_IS_IMPORTED)
    submission = load_submission(path, chapter.module)
    server = fork_server({chapter.id: submission})
    copy = server.preloaded_copy(chapter.preload)
    remote = RemoteSubmission(chapter, submission, FAST, torch.device("cpu"), server, copy)
    yield remote, copy
    remote.close()
    copy.close()
    server.close()


def test_the_exercise_that_preloads_runs_where_the_import_was_made(remote):
    remote, _ = remote
    remote.begin_check("softmax")
    assert remote.call("softmax", (torch.ones(2),), {}).tolist() == [1.0, 0.0]


def test_other_exercises_run_in_workers_of_the_plain_server(remote):
    remote, _ = remote
    remote.begin_check("softmax_numpy")
    assert remote.call("softmax_numpy", (torch.ones(2),), {}).tolist() == [0.0, 0.0]
    assert PRELOADED not in sys.modules  # nor was it imported by the grader


def test_a_copy_that_died_is_replaced_and_imports_again(remote):
    remote, copy = remote
    first = copy.pid
    os.kill(first, signal.SIGKILL)
    remote.begin_check("softmax")
    assert remote.call("softmax", (torch.ones(2),), {}).tolist() == [1.0, 0.0]
    assert copy.pid != first


def test_a_clean_parent_imports_its_preload_for_every_server_it_forks(tmp_path):
    chapter = find_chapter("ch01")
    path = tmp_path / chapter.file_name
    path.write_text(SEES_WHAT_IS_IMPORTED)
    submission = load_submission(path, chapter.module)
    with forkserver.clean_parent((OTHER,)):
        assert OTHER in forkserver.servers_origin().modules
        for _ in range(2):  # a second server as the first: the import was made once, before both
            server = fork_server({chapter.id: submission})
            remote = RemoteSubmission(chapter, submission, FAST, torch.device("cpu"), server, None)
            try:
                remote.begin_check("softmax")
                assert remote.call("softmax", (torch.ones(2),), {}).tolist() == [0.0, 1.0]
            finally:
                remote.close()
                server.close()
    assert OTHER not in sys.modules  # the clean parent imported it, not the grader
