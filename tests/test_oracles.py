"""The oracles the checks compare with are PyTorch's own answers, however they are reached."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from grader.catalog import COURSE_ROOT
from grader import oracles


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
@pytest.mark.parametrize("additive", [False, True], ids=["bool", "additive"])
def test_multihead_attention_matches_a_key_padding_mask(batch_first, additive):
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first).eval()
    batch, length, keys = 3, 4, 6
    query = torch.randn(batch, length, 8) if batch_first else torch.randn(length, batch, 8)
    key = torch.randn(batch, keys, 8) if batch_first else torch.randn(keys, batch, 8)
    padding = torch.rand(batch, keys) < 0.5
    padding[:, 0] = False  # every sequence keeps a key
    if additive:
        padding = torch.zeros(batch, keys).masked_fill(padding, float("-inf"))
    with torch.no_grad():
        expected, expected_weights = module(query, key, key, key_padding_mask=padding,
                                            average_attn_weights=False)
        got, weights = oracles.multihead_attention(module, query, key, key, padding,
                                                   average_attn_weights=False)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(weights, expected_weights)
    # A mask that hides nothing would make the comparison pass trivially.
    assert not torch.allclose(got, module(query, key, key)[0].detach())


def test_grading_the_course_imports_neither_sympy_nor_nbformat():
    """A grade of every chapter's reference passes, and leaves neither
    nbformat nor (where avoidable) sympy imported in the grading process."""
    # nn.MultiheadAttention's key_padding_mask check and torch.broadcast_shapes
    # import sympy on first use (half a second); a .py submission needs no nbformat.
    # On torch 2.5 any module built on the meta device (chapter 3's count of a
    # model too wide to build) imports sympy: there only nbformat is asked about.
    # Whether it does is asked of a copy forked from the same fresh interpreter just
    # after ``import torch``, before the grader is imported: what a second
    # interpreter would answer (that was one more start of torch, 3 s), and nothing
    # the copy imports reaches the process that grades.
    code = """
import os, sys, torch

child = os.fork()
if child == 0:
    status = 3  # neither answer: the meta module could not be built
    try:
        torch.nn.Linear(2, 2, device="meta")
        status = 0 if "sympy" in sys.modules else 1
    finally:
        os._exit(status)
meta_modules_import_sympy = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
avoidable = ["nbformat"] + ([] if meta_modules_import_sympy else ["sympy"])

from grader.catalog import CHAPTERS, COURSE_ROOT
from grader.grading import grade

report = grade([(c, COURSE_ROOT / "solutions" / f"{c.module}.py") for c in CHAPTERS], seed=3)
print(report.passed, sorted(set(avoidable) & set(sys.modules)))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=COURSE_ROOT)
    assert done.stdout.split("\n")[0] == "True []", done.stdout + done.stderr
