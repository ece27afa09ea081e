"""Notes where an exercise's own code names what it asks the student to
write, read from the source without running it: a note, never a point.

What decides points is what runs: a forbidden call is refused when it is
made, at torch's dispatcher in the worker (``grader.refusals``), and the
operating system (``grader.isolation``) is what keeps student code in its
place. This scan only tells a student more: it reads the syntax tree in the
grader and, where an exercise's code names one of its forbidden functions,
also on a branch no check's input takes, adds one note to that exercise's
verdict ("line 12 calls torch.softmax, which this exercise asks you to
write yourself"). It never fails a check, whatever the file imports or
reaches.

* It reads the exercise's own code: its definition and the file's
  functions and classes it uses, directly or not. Code under ``if __name__
  == "__main__":`` (the grader never runs it) and under ``if TYPE_CHECKING:``
  (nothing runs it) is not read.
* A forbidden entry names a family: ``torch.nn.MultiheadAttention`` also
  forbids ``torch.nn.MultiheadAttention.forward``. Where an entry names a
  whole library (``torch`` in the NumPy exercises, ``catalog.WHOLE_LIBRARY``)
  only its calls count: ``torch.float32`` as a dataclass's default or
  ``torch.Tensor`` in an ``isinstance`` computes nothing with torch.
* Names are judged, not imports: ``import torch.nn.functional as F``,
  ``T = torch`` and ``sm = torch.softmax`` make a name resolve like what it
  is bound to, and ``getattr(torch, "soft" + "max")`` is read as
  ``torch.softmax`` (``grader.name_resolution``). A method of an object,
  ``x.softmax(-1)``, is not judged: the source cannot tell a tensor from the
  student's own object (``stats.softmax(x)``); the worker can.

Every walk here is iterative or bounded: a submission deep enough to make a
recursive walk raise ``RecursionError`` must not crash the grader.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import NamedTuple

from grader.catalog import WHOLE_LIBRARY, Chapter
from grader.loading import Submission
from grader.name_resolution import aliases_of, dotted_name, link_below, walk


class Finding(NamedTuple):
    """A forbidden name an exercise's code reaches: on which line, resolved
    (``torch.nn.functional.softmax`` for ``F.softmax``), and whether it is
    called there (``F.softmax(x)``) or only named (``act = F.softmax``)."""

    line: int
    name: str
    called: bool


def notes(chapter: Chapter, submission: Submission, only: set[str] | None = None) -> dict[str, str]:
    """One note per exercise of ``chapter`` whose own code reaches what the
    exercise may not call (its first finding), by exercise name; exercises
    with nothing to note, or not in ``only``, are not in it. The file's tree
    is read once for all of them."""
    wanted = [exercise for exercise in chapter.exercises
              if exercise.forbidden and (only is None or exercise.name in only)]
    if not wanted:
        return {}
    scan = Scan(ast.Module(body=[node for _, _, node in submission.statements], type_ignores=[]))
    found = {}
    for exercise in wanted:
        findings = scan.findings(exercise.name, exercise.forbidden)
        if findings:
            found[exercise.name] = note(findings[0], submission.where(findings[0].line), exercise.forbidden)
    return found


def note(finding: Finding, where: str, forbidden: Iterable[str]) -> str:
    """The sentence a student reads for ``finding``: ``where`` says where its
    line is (``line 12``, or a notebook's cell); ``forbidden`` is the
    exercise's catalog entry, which the finding came from."""
    verb = "calls" if finding.called else "uses"
    library = next((family for family in forbidden
                    if family in WHOLE_LIBRARY and _in_family(finding.name, {family})), None)
    if library is not None:
        return f"{where} {verb} {finding.name}: this exercise is written without {library}"
    return f"{where} {verb} {finding.name}, which this exercise asks you to write yourself"


class Scan:
    """One submission's syntax tree, read for every exercise of its chapter:
    what the file's names resolve to, and what each of its functions and
    classes names, are worked out once."""

    def __init__(self, tree: ast.Module):
        self.definitions = {node.name: node for node in tree.body
                            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        # A function or class the file defines is its own, whatever else the
        # name was bound to (an import kept for comparing, say).
        self.aliases = {name: dotted for name, dotted in aliases_of(tree).items()
                        if name not in self.definitions}
        self._read: dict[str, _Definition] = {}

    def findings(self, exercise: str, forbidden: Iterable[str]) -> list[Finding]:
        """The forbidden names the exercise's own code reaches, sorted by line.

        Args:
            exercise: the function or class the exercise asks for; its body
                and the bodies of the file's functions and classes it uses
                (directly or not) are read. Nothing else of the file is.
            forbidden: dotted names, as the catalog lists them.
        """
        if exercise not in self.definitions:
            return []
        families = frozenset(forbidden)
        libraries = families.intersection(WHOLE_LIBRARY)
        found = set()
        for name in self._reached(exercise):
            for finding in self._definition(name).names:
                # Of a whole library only calls count: reading torch.float32 computes nothing.
                if _in_family(finding.name, families) and (
                        finding.called or not _in_family(finding.name, libraries)):
                    found.add(finding)
        return sorted(found)

    def _reached(self, exercise: str) -> set[str]:
        """``exercise`` and the file's functions and classes it uses, directly or not."""
        reached, todo = {exercise}, [exercise]
        while todo:
            for name in self._definition(todo.pop()).uses - reached:
                reached.add(name)
                todo.append(name)
        return reached

    def _definition(self, name: str) -> _Definition:
        if name not in self._read:
            self._read[name] = _Definition.of(self.definitions[name], self.definitions, self.aliases)
        return self._read[name]


class _Definition(NamedTuple):
    """What one function or class of the file names: the file's other
    functions and classes (``uses``), and every name it reaches through the
    file's imports, resolved (``names``)."""

    uses: frozenset[str]
    names: tuple[Finding, ...]

    @classmethod
    def of(cls, node: ast.AST, definitions: dict[str, ast.AST], aliases: dict[str, str]) -> _Definition:
        """Only the outermost link of a chain (``torch.nn.functional.softmax``,
        ``getattr(torch, "softmax")``) is resolved: a shorter one is a prefix
        of it, and resolving every link of a long chain would cost its
        length squared."""
        items = list(walk(node))
        below = {}  # id of a link -> the next link down
        called = set()  # ids of what calls call
        for item in items:
            link = link_below(item, aliases)
            if link is not None:
                below[id(item)] = link
            if isinstance(item, ast.Call):
                called.add(id(item.func))
        inner = {id(link) for link in below.values()}
        uses, names = set(), []
        for item in items:
            if isinstance(item, ast.Name) and item.id in definitions and item.id not in aliases:
                uses.add(item.id)
            if id(item) in inner or not (id(item) in below or isinstance(item, ast.Name)):
                continue
            if isinstance(item, (ast.Name, ast.Attribute)) and not isinstance(item.ctx, ast.Load):
                continue  # binding or patching a name is not using it
            start = item
            while id(start) in below:
                start = below[id(start)]
            if isinstance(start, ast.Name) and start.id in aliases:  # else: the student's own objects
                dotted = dotted_name(item, aliases)
                if dotted is not None:
                    names.append(Finding(item.lineno, dotted, id(item) in called))
        return cls(frozenset(uses), tuple(names))


def forbidden_uses(tree: ast.Module, exercise: str, forbidden: Iterable[str]) -> list[Finding]:
    """``Scan(tree).findings(exercise, forbidden)``: for one exercise alone."""
    return Scan(tree).findings(exercise, forbidden)


def _in_family(dotted: str, families: Iterable[str]) -> bool:
    """Is ``dotted`` one of ``families`` or below one of them?"""
    return any(dotted == family or dotted.startswith(family + ".") for family in families)
