"""Random one-token slips of the reference solutions, made on the text.

``bench/hints.py --slips N`` grades N of them a chapter: the kind of
mistakes nobody wrote down (an operator, a number, an axis, a method for
another, a call left out), drawn at random from every solution line, to
measure hints on mistakes that neither the known-bug catalog nor the corpus
of ``tests/mistakes/`` was written for. They are made on the text with
regular expressions, not by ``grader/edits.py``, so that its own set of
edits is not what is measured against itself.
"""

from __future__ import annotations

import ast
import random
import re
from functools import cache

from grader.catalog import Chapter
from grader.known_bugs import KNOWN_BUGS, function_span

# A method or function for another (more than grader/edits.py's twins, and one way only).
OTHERS = {"sum": ("mean", "prod"), "mean": ("sum",), "amax": ("amin", "mean"), "max": ("min",), "min": ("max",),
          "softmax": ("log_softmax",), "log_softmax": ("softmax",), "exp": ("log", "expm1"), "log": ("exp",),
          "sqrt": ("rsqrt", "exp"), "triu": ("tril",), "tril": ("triu",), "cos": ("sin",), "sin": ("cos",),
          "zeros": ("ones", "empty"), "ones": ("zeros",), "all": ("any",), "any": ("all",), "cat": ("stack",),
          "stack": ("cat",), "logaddexp": ("maximum",), "maximum": ("minimum",), "isneginf": ("isinf",),
          "unsqueeze": ("squeeze",), "expand": ("repeat",), "reshape": ("view",), "arange": ("ones",)}
_OPERATOR = re.compile(r"(?<=\s)[-+*/@](?=\s)")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?![\w.])")
_AXIS = re.compile(r"\b(dim|axis)=(-?\d+)")
_NAME = re.compile(r"(?<=[.\s(])(\w+)(?=\()")
_MODULES = ("torch", "math", "np", "F", "nn")
_METHOD_CALL = re.compile(r"\.(\w+)\(([^()]*(?:\([^()]*\))?[^()]*)\)")


def _candidates(line: str) -> list[tuple[str, str]]:
    """Each ``(kind, new line)`` one slip makes of ``line``."""
    made = []
    for match in _OPERATOR.finditer(line):
        for other in "+-*/":
            if other != match.group():
                made.append(("operator", line[:match.start()] + other + line[match.end():]))
    for match in _AXIS.finditer(line):
        for other in ("-2", "-1", "0", "1"):
            if other != match.group(2):
                made.append(("axis", line[:match.start(2)] + other + line[match.end(2):]))
    for match in _NUMBER.finditer(line):
        if _AXIS.search(line[max(0, match.start() - 5):match.end()]):
            continue  # an axis: above
        value = int(match.group())
        for other in sorted({value + 1, value - 1, -value, 0, 1, 2} - {value}):
            made.append(("number", line[:match.start()] + str(other) + line[match.end():]))
    for match in _NAME.finditer(line):
        for other in OTHERS.get(match.group(1), ()):
            made.append(("method", line[:match.start(1)] + other + line[match.end(1):]))
    for match in _METHOD_CALL.finditer(line):
        owner = re.search(r"(\w+)$", line[:match.start()])
        if owner is None or owner.group(1) not in _MODULES:
            made.append(("call", line[:match.start()] + line[match.end():]))  # x.transpose(-2, -1) -> x
        elif "," not in match.group(2) and match.group(2).strip():  # torch.exp(x) -> x
            made.append(("call", line[:owner.start()] + match.group(2) + line[match.end():]))
    return made


@cache
def random_slips(chapter: Chapter, count: int, seed: int) -> tuple:
    """``count`` slips of ``chapter``'s solution lines (``KnownBug``-like:
    ``exercise``, ``name``, ``old``, ``new``), each a whole line with one
    token changed, that still parse, drawn at random with ``seed``, none a
    known bug."""
    from mistakes import Mistake  # tests/mistakes, on the path bench/hints.py sets

    source = chapter.solution().read_text(encoding="utf-8")
    tree = ast.parse(source)
    known = {(bug.exercise, bug.old.strip(), bug.new.strip()) for bug in KNOWN_BUGS.get(chapter.id, ())}
    pool = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue
        start, end = function_span(source, node.name)
        body = source[start:end]
        inside = False
        for line in body.splitlines(keepends=True):
            stripped = line.strip()
            if stripped.startswith("# BEGIN SOLUTION"):
                inside = True
            elif stripped.startswith("# END SOLUTION"):
                inside = False
            elif inside and stripped and not stripped.startswith("#") and body.count(line) == 1:
                code = line.split("  #")[0].rstrip("\n")
                for kind, new in _candidates(code):
                    pool.append((node.name, kind, line, line.replace(code, new, 1)))
    rng = random.Random(seed)
    rng.shuffle(pool)
    chosen = []
    for exercise, kind, old, new in pool:
        if len(chosen) == count:
            break
        if (exercise, old.strip(), new.strip()) in known:
            continue
        try:
            ast.parse(source.replace(old, new, 1))
        except SyntaxError:
            continue
        chosen.append(Mistake(exercise, f"{kind}-{len(chosen)}", old, new, None, kind))
    return tuple(chosen)
