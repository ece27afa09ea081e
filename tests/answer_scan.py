"""Which functions defined in the hidden checks compute an exercise's answer?

Run as ``python answer_scan.py CASES OUT [EXTRA.py ...]`` with the tree to
scan first on the path (a student edition: ``PYTHONPATH=DIR``, run from DIR).
CASES is a ``torch.save`` file of ``[(chapter id, exercise, args, kwargs,
expected)]``: the reference's answers to sample calls (the edition has no
reference to ask). Every function defined in the checks (``grader/checks.py`` and each
chapter's ``test_chNN_slug.py``, at any
depth: a nested helper is as easy to copy) and in each EXTRA file is called
with the samples of each exercise of its chapter (every chapter for
``grader.checks`` itself and the extras); the function answers an exercise
when it returns the expected value for all of them. OUT gets JSON:
``{"scanned": N, "answers": [[chapter, exercise, "file:function", source]]}``.
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
import textwrap
import types
import warnings
from pathlib import Path

import numpy as np
import torch


def functions(path: Path, namespace: dict) -> dict[str, tuple[object, str]]:
    """``{"file:name@line": (function, source)}`` for every ``def`` in the
    file, executed in ``namespace`` (the module's globals); functions whose
    definition needs what only their enclosing function has are left out."""
    source = path.read_text(encoding="utf-8")
    found = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("test_"):
            continue
        text = textwrap.dedent(ast.get_source_segment(source, node))
        space = dict(namespace)
        try:
            exec(compile(text, str(path), "exec"), space)  # noqa: S102 - our own checks' code
        except Exception:  # a decorator or default from the enclosing scope
            continue
        found[f"{path.name}:{node.name}@{node.lineno}"] = (space[node.name], text)
    return found


def same(got, expected) -> bool:
    if isinstance(expected, (tuple, list)):
        return (isinstance(got, (tuple, list)) and len(got) == len(expected)
                and all(same(g, e) for g, e in zip(got, expected)))
    if isinstance(expected, np.ndarray):
        if not isinstance(got, np.ndarray) or got.dtype != expected.dtype:
            return False
        got, expected = torch.from_numpy(got), torch.from_numpy(expected)
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.dtype != expected.dtype:
            return False
        return bool(torch.isclose(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True).all()
                    if expected.is_floating_point() else torch.equal(got, expected))
    return type(got) is type(expected) and got == expected


def answers(function, samples) -> bool:
    for args, kwargs, expected in samples:
        try:
            with torch.no_grad():
                if not same(function(*args, **kwargs), expected):
                    return False
        except Exception:
            return False
    return True


def main(cases_path: str, out: str, *extras: str) -> None:
    warnings.filterwarnings("ignore")
    from grader.catalog import CHAPTERS

    cases = torch.load(cases_path, weights_only=False)
    samples: dict[tuple[str, str], list] = {}
    for chapter_id, exercise, args, kwargs, expected in cases:
        samples.setdefault((chapter_id, exercise), []).append((args, kwargs, expected))
    everyone = [chapter.id for chapter in CHAPTERS]
    sources: list[tuple[Path, dict, list[str]]] = []
    shared = importlib.import_module("grader.checks")
    sources.append((Path(shared.__file__), vars(shared), everyone))
    for chapter in CHAPTERS:
        module = importlib.import_module(f"{chapter.package}.test_{chapter.module}")
        sources.append((Path(module.__file__), vars(module), [chapter.id]))
    for extra in extras:
        module = types.ModuleType("extra")
        exec(compile(Path(extra).read_text(encoding="utf-8"), extra, "exec"), vars(module))  # noqa: S102
        sources.append((Path(extra), vars(module), everyone))
    scanned, found = 0, []
    for path, namespace, chapters in sources:
        for name, (function, text) in functions(path, namespace).items():
            scanned += 1
            for (chapter_id, exercise), calls in samples.items():
                if chapter_id in chapters and answers(function, calls):
                    found.append([chapter_id, exercise, name, text])
    Path(out).write_text(json.dumps({"scanned": scanned, "answers": found}), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
