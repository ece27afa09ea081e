"""One-slip edits of the reference: the mistakes nobody catalogued, named.

A student's wrong function is most often the right one with one slip: an
operator, a number, an axis, a name, a call or a line that is missing. So
when an answer fails and no known bug, no combination of them and no
variant of the call gives it, the grader tries each such edit of the
exercise's reference definition on the same inputs (in its own process,
after the known bugs, as ``known_bugs.Lookalikes`` runs them). An edit whose
output is the student's names the slip in the student's terms: the
expression as the edit has it, the expression it replaces, and the line it
is on.

The edits are made on the definition's syntax tree, one place at a time:

* an operator: ``+`` and ``-``, ``*`` and ``/``, ``/`` and ``//``, the
  operands of ``-``, ``/`` and ``@`` exchanged, one operand of ``+``,
  ``-``, ``*`` or ``/`` left out;
* a comparison: ``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``;
  a ``-``, ``~`` or ``not`` left out;
* a whole number one more, one less or negated (an axis, an offset, an
  index); ``True`` and ``False``; ``"-inf"`` and ``"inf"``;
* a function or method for its twin (``softmax``/``log_softmax``,
  ``sum``/``mean``, ``amax``/``amin``, ``triu``/``tril``, ``sin``/``cos``
  and the like), a name for its twin in the roles of attention (``q``,
  ``k``, ``v``, ``o``: ``w_k`` for ``w_q``);
* two arguments of a call, or two items of a tuple or list, exchanged
  (``(sin, cos)`` for ``(cos, sin)``, also as targets);
* a call left out (its argument, or the object of a method, used as it
  is), a keyword argument left out, a line left out.

An edit that gives the reference's own answer explains nothing and is
never offered; one that raises is offered only to a submission that
raised the same error on the same inputs (``check_runner``). Every
edit's hint is a ``compare.RelationHint`` named ``relations.EDIT``: the
exercise's checks must agree on it as on a relation (``check_runner``),
and the student edition records it as it records a variant, and what it
raises (``recorded``, format 4).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from grader.catalog import COURSE_ROOT, Chapter
from grader.relations import EDIT, RelationHint

# Twins a student takes one for the other (either way round).
TWINS = (("softmax", "log_softmax"), ("sum", "mean"), ("max", "min"), ("amax", "amin"),
         ("argmax", "argmin"), ("triu", "tril"), ("sin", "cos"), ("zeros", "ones"),
         ("zeros_like", "ones_like"), ("all", "any"), ("cat", "stack"), ("isneginf", "isinf"),
         ("sqrt", "rsqrt"), ("exp", "log"), ("repeat_interleave", "repeat"), ("minimum", "maximum"))
_TWIN = {one: other for pair in TWINS for one, other in (pair, pair[::-1])}
# The roles in attention a name may carry as one of its ``_``-separated parts (``w_q``, ``k_cache``).
ROLES = ("q", "k", "v", "o")
_SWAPPED_OPERATORS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                      ast.FloorDiv: ast.Div}
_COMPARED = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq}
_CONTEXT = 12  # characters: a changed expression shorter than this is shown within its enclosing one
_LONGEST = 72  # characters of an expression or line a hint quotes


@dataclass(frozen=True)
class Edit:
    """One slip in ``exercise``'s definition; ``hint`` names it."""

    exercise: str
    hint: RelationHint
    definition: ast.FunctionDef | ast.ClassDef = field(compare=False, repr=False)  # the reference's, unedited
    slot: _Slot = field(compare=False, repr=False)  # swapped in, it makes the edit

    @property
    def name(self) -> str:
        return self.hint.name

    @contextmanager
    def made(self) -> Iterator[ast.FunctionDef | ast.ClassDef]:
        """The definition with this edit in it, until the block ends."""
        self.slot.swap()
        try:
            yield self.definition
        finally:
            self.slot.swap()

    def source(self) -> str:
        """The edited definition, as ``ast.unparse`` writes it."""
        with self.made() as definition:
            return ast.unparse(definition)


@dataclass
class _Slot:
    """Where an edit puts ``new``: field ``field`` of ``parent`` (item ``index`` of a list field)."""

    parent: ast.AST
    field: str
    index: int | None
    new: ast.AST

    def swap(self) -> None:
        """Put ``new`` in, keeping what was there as the next ``new`` (twice undoes it)."""
        if self.index is None:
            old = getattr(self.parent, self.field)
            setattr(self.parent, self.field, self.new)
        else:
            items = getattr(self.parent, self.field)
            old, items[self.index] = items[self.index], self.new
        self.new = old


def _quoted(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= _LONGEST else text[:_LONGEST - 3] + "..."


class _Definition:
    """An exercise's reference definition, its nodes' parents and names."""

    def __init__(self, node: ast.FunctionDef | ast.ClassDef):
        self.node = node
        self.parents: dict[ast.AST, ast.AST] = {}
        for parent in ast.walk(node):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
        self.names = {child.id for child in ast.walk(node) if isinstance(child, ast.Name)}
        self.names |= {child.arg for child in ast.walk(node) if isinstance(child, ast.arg)}
        self.attributes = {child.attr for child in ast.walk(node) if isinstance(child, ast.Attribute)}

    def statement(self, node: ast.AST) -> ast.stmt:
        while not isinstance(node, ast.stmt):
            node = self.parents[node]
        return node

    def shown(self, node: ast.AST) -> ast.AST:
        """The expression a hint quotes for a change at ``node``: the node, or
        the smallest expression around it that reads on its own."""
        while isinstance(self.parents.get(node), (ast.expr, ast.keyword)) and len(ast.unparse(node)) < _CONTEXT \
                and len(ast.unparse(self.parents[node])) <= _LONGEST:
            node = self.parents[node]
        return node

    def where(self, node: ast.AST) -> str:
        """The line ``node`` is on, in words."""
        statement = self.statement(node)
        if isinstance(statement, ast.Assign):
            return f"where `{_quoted(statement.targets[0])}` is computed"
        if isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
            return f"where `{_quoted(statement.target)}` is computed"
        if isinstance(statement, ast.Return):
            return "in what is returned"
        if isinstance(statement, ast.If) and node is not statement:
            return f"in the test `if {_quoted(statement.test)}`"
        if isinstance(statement, ast.For):
            return f"in the loop `for {_quoted(statement.target)} in {_quoted(statement.iter)}`"
        return f"in `{_quoted(statement)}`"


def _twin_name(name: str, known: set[str]) -> list[str]:
    """The names in ``known`` that are ``name`` with one role part changed (``w_q`` -> ``w_k``)."""
    parts = name.split("_")
    twins = []
    for at, part in enumerate(parts):
        if part in ROLES:
            for role in ROLES:
                twin = "_".join(parts[:at] + [role] + parts[at + 1:])
                if role != part and twin in known:
                    twins.append(twin)
    return twins


def _number(node: ast.AST) -> int | None:
    """The whole number ``node`` writes (``-1`` is a minus and a 1), else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) is int:
        return -node.operand.value
    return None


def _written(value: int) -> ast.expr:
    return ast.Constant(value) if value >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-value))


def _changes(definition: _Definition) -> Iterator[tuple[ast.AST, _Slot]]:
    """Each one-place change of the definition: ``(the node changed, the slot that changes it)``."""
    skipped = set()  # what is not computation: docstrings, annotations, defaults, decorators, errors
    for node in ast.walk(definition.node):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            if ast.get_docstring(node) is not None:
                skipped.add(node.body[0])
            skipped.update(node.decorator_list)
            if isinstance(node, ast.FunctionDef):
                skipped.update(node.args.defaults + [d for d in node.args.kw_defaults if d is not None])
                skipped.update(a.annotation for a in ast.walk(node.args) if isinstance(a, ast.arg) and a.annotation)
                if node.returns is not None:
                    skipped.add(node.returns)
        elif isinstance(node, (ast.AnnAssign, ast.arg)) and node.annotation is not None:
            skipped.add(node.annotation)
        elif isinstance(node, (ast.Raise, ast.Assert)):
            skipped.add(node)
    inside = set()
    for node in skipped:
        inside.update(ast.walk(node))

    for node in ast.walk(definition.node):
        if node in inside:
            continue
        parent = definition.parents.get(node)
        yield from _node_changes(definition, node, parent)


def _replace(definition: _Definition, node: ast.AST, new: ast.AST) -> _Slot:
    """The slot that puts ``new`` where ``node`` is."""
    parent = definition.parents[node]
    # Located where ``node`` is, with any node made for it (a constant) too: compile needs lines.
    new = ast.fix_missing_locations(ast.copy_location(new, node))
    for name, value in ast.iter_fields(parent):
        if value is node:
            return _Slot(parent, name, None, new)
        if isinstance(value, list) and any(item is node for item in value):
            return _Slot(parent, name, next(i for i, item in enumerate(value) if item is node), new)
    raise LookupError("a node without its parent")


def _exchanged(items: list[ast.expr]) -> Iterator[tuple[int, int]]:
    """The pairs of ``items`` (of the first four) a student may exchange."""
    for one, other in itertools.combinations(range(min(len(items), 4)), 2):
        if not any(isinstance(items[at], ast.Starred) for at in (one, other)) and \
                ast.dump(items[one]) != ast.dump(items[other]):
            yield one, other


def _swapped(items: list[ast.expr], one: int, other: int) -> list[ast.expr]:
    items = list(items)
    items[one], items[other] = items[other], items[one]
    return items


def _swaps_nothing(node: ast.AST) -> bool:
    """A swap of an axis with itself (``k.transpose(-1, -1)``): the same
    edit as the call left out, which is made anyway."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr in ("transpose", "swapaxes", "swapdims") and len(node.args) >= 2 and \
        ast.dump(node.args[-1]) == ast.dump(node.args[-2])


def _one(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value == 1


def _simplest(node: ast.AST) -> ast.AST:
    """``node`` without a factor or divisor of 1 (``1 * x``, ``x / 1``: ``x``), so
    that edits that write one expression two ways are one edit."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)) and _one(node.right):
        return node.left
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and _one(node.left):
        return node.right
    return node


def _node_changes(definition: _Definition, node: ast.AST, parent: ast.AST | None) -> Iterator[tuple[ast.AST, _Slot]]:
    replace = lambda new: (node, _replace(definition, node, _simplest(new)))  # noqa: E731 - "replace by"
    if isinstance(node, ast.BinOp):
        swapped = _SWAPPED_OPERATORS.get(type(node.op))
        if swapped is not None:
            yield replace(ast.BinOp(node.left, swapped(), node.right))
        if isinstance(node.op, (ast.Sub, ast.Div, ast.MatMult)):
            yield replace(ast.BinOp(node.right, node.op, node.left))
        if isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            yield replace(node.left)
            if isinstance(node.op, (ast.Add, ast.Mult)):
                yield replace(node.right)
    elif isinstance(node, ast.UnaryOp) and _number(node) is None:
        yield replace(node.operand)
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARED:
        yield replace(ast.Compare(node.left, [_COMPARED[type(node.ops[0])]()], node.comparators))
    elif _number(node) is not None and not (isinstance(node, ast.Constant) and isinstance(parent, ast.UnaryOp)):
        value = _number(node)
        for changed in dict.fromkeys((value + 1, value - 1, -value)):
            if changed != value:
                yield replace(_written(changed))
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield replace(ast.Constant(not node.value))
    elif isinstance(node, ast.Constant) and node.value in ("-inf", "inf"):
        yield replace(ast.Constant("inf" if node.value == "-inf" else "-inf"))
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        for twin in _twin_name(node.id, definition.names) + ([_TWIN[node.id]] if node.id in _TWIN else []):
            yield replace(ast.Name(twin, ast.Load()))
    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        twins = _twin_name(node.attr, definition.attributes) + ([_TWIN[node.attr]] if node.attr in _TWIN else [])
        for twin in twins:
            yield replace(ast.Attribute(node.value, twin, ast.Load()))
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and not (isinstance(node.func.value, ast.Name)
                                                        and node.func.value.id in ("torch", "math", "np", "F")):
            yield replace(node.func.value)  # x.transpose(-2, -1) -> x
        elif len(node.args) == 1 and not node.keywords:
            yield replace(node.args[0])  # torch.exp(x) -> x
        for at in range(len(node.keywords)):
            yield replace(ast.Call(node.func, node.args, node.keywords[:at] + node.keywords[at + 1:]))
        for one, other in _exchanged(node.args):
            yield replace(ast.Call(node.func, _swapped(node.args, one, other), node.keywords))
    if isinstance(node, (ast.Tuple, ast.List)):  # (cos, sin) -> (sin, cos), also as a target
        for one, other in _exchanged(node.elts):
            yield replace(type(node)(_swapped(node.elts, one, other), node.ctx))
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr)) and not isinstance(parent, ast.ClassDef):
        yield node, _replace(definition, node, ast.Pass())


def _hint(definition: _Definition, slot: _Slot, where: str) -> RelationHint:
    """The sentence for the change ``slot`` makes on the line ``where``
    (in words), made while the change is in place."""
    if isinstance(slot.new, ast.stmt):  # the line left out: slot.new holds it while the edit is in
        change = f"the line `{_quoted(slot.new)}` left out (or its result not kept)"
    else:
        shown = definition.shown(_current(slot))
        change = f"`{_quoted(shown)}` in place of `{_before(slot, shown)}`, {where}"
    return RelationHint(f"your code does what the reference does with one slip: {change}", EDIT)


def _current(slot: _Slot) -> ast.AST:
    return getattr(slot.parent, slot.field) if slot.index is None else getattr(slot.parent, slot.field)[slot.index]


def _before(slot: _Slot, shown: ast.AST) -> str:
    """``shown`` as the reference writes it (the edit undone for a moment)."""
    slot.swap()
    try:
        return _quoted(shown) if shown is not _current(slot) and any(n is _current(slot) for n in ast.walk(shown)) \
            else _quoted(_current(slot))
    finally:
        slot.swap()


def _reparented(definition: _Definition, slot: _Slot) -> None:
    """Record the new node's parents, so that ``shown`` climbs from it."""
    new = _current(slot)
    definition.parents[new] = slot.parent
    for parent in ast.walk(new):
        for child in ast.iter_child_nodes(parent):
            definition.parents.setdefault(child, parent)


@cache
def edits(chapter: Chapter, exercise: str, root: Path = COURSE_ROOT) -> tuple[Edit, ...]:
    """Each edit of ``exercise``'s definition in the reference, none where
    the exercise is not a top-level definition of it. ``known_bugs``
    compiles each (``Edit.made``) and runs it over the reference."""
    tree = ast.parse(chapter.solution(root).read_text(encoding="utf-8"))
    node = next((item for item in tree.body if isinstance(item, (ast.FunctionDef, ast.ClassDef))
                 and item.name == exercise), None)
    if node is None:
        return ()
    definition = _Definition(node)
    made, seen = [], set()
    for changed, slot in list(_changes(definition)):
        where = definition.where(changed)
        slot.swap()
        try:
            written = (id(slot.parent), slot.field, slot.index, ast.dump(_current(slot)))
            if written in seen or _swaps_nothing(slot.parent):  # written before, or the call left out
                continue
            seen.add(written)
            if not isinstance(slot.new, ast.stmt):
                _reparented(definition, slot)
            hint = _hint(definition, slot, where)
        finally:
            slot.swap()
        made.append(Edit(exercise, hint, node, slot))
    return tuple(made)
