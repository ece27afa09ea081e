"""In the worker: refuse what an exercise asks the student to write, at torch's dispatcher.

A worker serves one exercise. Before the first statement of the student's
file runs, ``install`` puts a refusal in torch's dispatcher, in place of
every kernel of every ATen operator behind the exercise's forbidden
functions (``catalog.KERNELS``: ``aten::_softmax`` and its siblings behind
``torch.softmax``, ``F.softmax`` and ``Tensor.softmax``; every operator
there is where an exercise may not use torch at all), on every dispatch key
that has one (CPU, CUDA, Meta, sparse, nested, quantized, MKL-DNN...). Every
route to the operator ends at one of those kernels: the functional and the
method, ``torch.ops.aten._softmax``, ``vmap``, autograd, inference mode, a
tensor subclass whose ``__torch_dispatch__`` calls the operator again, a
call from another thread. The dispatcher's table is the process's own, not
a thread's or a mode's, and nothing here can be popped or switched off:
the handles that could undo a registration are kept where Python code
cannot reach them (``_keep_out_of_reach``).

A forbidden function written in Python (``F.multi_head_attention_forward``,
which ``nn.MultiheadAttention`` calls; ``F.softmax``) has its code replaced
in place, so that every reference to it, taken before or after, refuses; its
old code is gone from the process. One whose module is not imported yet
(``scipy.special.softmax`` in the NumPy exercises,
``torch.ao.nn.quantizable.MultiheadAttention``) gets the same treatment as
soon as its module is.

What a refusal is: a ``RuntimeError`` whose message names what was refused
and ends with ``REFUSED``. It comes back to the grader as any exception of
the student's call does, and costs the call its answer. A student may catch
it: what the call then returns is judged like any answer, so it has to be
right, computed some other way.

Not promised: a Python composition inside torch's private modules
(``torch._refs.softmax``, ``torch._decomp``) is the library's source code, no
different from the same lines copied into the student's file; and code that
rewrites the interpreter's memory (``ctypes``) to reach a kernel by a
private route is beyond any check made inside the process. Such code still
has to return the right values.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.abc
import sys
import types
import warnings
from collections.abc import Iterable

import torch

from grader.catalog import KERNELS, WHOLE_LIBRARY

REFUSED = "may not be used in this exercise"

# The dense backends: an operator without a kernel of its own there may still
# run on one through a composite default, so a refusal goes there too.
_DENSE = ("CPU", "CUDA", "Meta")
# Where an exercise that may not use torch at all could compute: every
# operator with a kernel of its own there is refused (composite ones run
# through those).
_COMPUTING = ("CPU", "CUDA", "SparseCPU", "SparseCUDA", "SparseCsrCPU", "SparseCsrCUDA",
              "QuantizedCPU", "QuantizedCUDA", "NestedTensorCPU", "NestedTensorCUDA", "MkldnnCPU")
# Dispatch keys that pass a call on rather than compute it: no refusal is needed there.
_PASSING_ON = ("Autograd", "Autocast", "Tracer", "FuncTorch", "Python", "ADInplaceOrView", "Functionalize",
               "Batched", "VmapMode", "PreDispatch", "BackendSelect", "Named", "Conjugate", "Negative",
               "ZeroTensor")


def install(forbidden: Iterable[str]) -> None:
    """Refuse, in this process and for good, everything ``forbidden`` names
    (an exercise's catalog entry): call once, before any student code runs."""
    forbidden = tuple(forbidden)
    if not forbidden:
        return
    libraries: dict[str, torch._C._DispatchModule] = {}
    watch = _ImportWatch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel", once an operator
        refused_operators = set()
        for dotted in forbidden:
            if dotted in WHOLE_LIBRARY:
                _refuse_every_operator(libraries, dotted)
                continue
            for operator in KERNELS.get(dotted, ()):
                if operator not in refused_operators:  # one family names it, and that is enough
                    refused_operators.add(operator)
                    _refuse_operator(libraries, operator, f"{dotted} (its kernel {operator})")
            _refuse_python_function(dotted, watch)
    _keep_out_of_reach(libraries.values())


def message(what: str) -> str:
    """The words of a refusal of ``what``: the grader reads it back by ``REFUSED``."""
    return f"{what} {REFUSED}"


def _refusing(what: str):
    text = message(what)

    def refused(*args, **kwargs):
        raise RuntimeError(text)

    return refused


def _library(libraries: dict, namespace: str) -> torch._C._DispatchModule:
    if namespace not in libraries:
        libraries[namespace] = torch._C._dispatch_library("IMPL", namespace, "")
    return libraries[namespace]


def _known_keys(names: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``names`` this build of torch has."""
    known = []
    for name in names:
        with contextlib.suppress(Exception):
            torch._C._dispatch_key_parse(name)
            known.append(name)
    return tuple(known)


_DENSE_KEYS = _known_keys(_DENSE)
_COMPUTING_KEYS = _known_keys(_COMPUTING)


def _refuse_operator(libraries: dict, operator: str, what: str) -> None:
    """Every overload of ``operator`` (none where this build lacks it), on
    every backend with a kernel of its own and every dense backend that
    would reach a composite one."""
    refused = _refusing(what)
    namespace, name = operator.split("::", 1)
    for schema in torch._C._jit_get_schemas_for_operator(operator):
        overload = f"{name}.{schema.overload_name}" if schema.overload_name else name
        full = f"{namespace}::{overload}"
        keys = {key for key in _direct_keys(full) if not key.startswith(_PASSING_ON)}
        keys.update(key for key in _DENSE_KEYS
                    if torch._C._dispatch_has_computed_kernel_for_dispatch_key(full, key))
        for key in sorted(keys):
            _library(libraries, namespace).impl(overload, key, refused)


def _direct_keys(overload: str) -> list[str]:
    """The runtime keys ``overload`` has a kernel of its own for, as the
    dispatcher lists them (``CPU: registered at ...``), active ones only."""
    keys = []
    for line in torch._C._dispatch_dump(overload).splitlines():
        key, colon, rest = line.partition(":")
        if colon and rest.startswith(" registered at") and key.isidentifier() and key != "debug":
            keys.append(key)
    return keys


def _refuse_every_operator(libraries: dict, dotted: str) -> None:
    """Every operator of every namespace, on each computing backend it has a
    kernel of its own for: no tensor can be computed with at all."""
    refused = _refusing(dotted)
    for key in _COMPUTING_KEYS:
        for operator in torch._C._dispatch_get_registrations_for_dispatch_key(key):
            namespace, name = operator.split("::", 1)
            _library(libraries, namespace).impl(name, key, refused)


def _keep_out_of_reach(libraries: Iterable[object]) -> None:
    """Keep the registrations for the life of the process with no Python
    reference to their handles left: a handle's ``reset()``, or its last
    reference dropped, would put the old kernels back."""
    for library in libraries:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(library))


def _refuse_python_function(dotted: str, watch: _ImportWatch) -> None:
    """A forbidden function written in Python refuses wherever it is
    referenced; so does a forbidden class's ``forward``. A function of a
    library not yet imported is replaced when its module is (``watch``)."""
    target = _resolve(dotted)
    owner = dotted.rpartition(".")[0]
    if target is None and owner not in sys.modules:
        watch.wait_for(owner, dotted)
        return
    if isinstance(target, type):
        target = getattr(target, "forward", None)
    if isinstance(target, types.FunctionType) and not target.__code__.co_freevars:
        target.__code__ = _refusing_code(dotted)


def _refusing_code(dotted: str) -> types.CodeType:
    """Code that raises a refusal of ``dotted`` and needs nothing from the
    globals of the function it is put in (they are the library's)."""
    namespace: dict = {}
    exec(f"def refused(*args, **kwargs):\n    raise RuntimeError({message(dotted)!r})\n", namespace)  # noqa: S102
    return namespace["refused"].__code__


def _resolve(dotted: str) -> object | None:
    """``"torch.nn.functional.softmax"`` -> the function, or None if absent:
    the longest prefix that is an imported module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        target = sys.modules.get(".".join(parts[:cut]))
        if target is not None:
            for part in parts[cut:]:
                target = getattr(target, part, None)
            return target
    return None


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Replaces the forbidden functions of a module as soon as it has been
    imported (``scipy.special`` for ``scipy.special.softmax``): first on the
    import path, it finds the module as the other finders do and runs the
    replacement after the module's own code."""

    def __init__(self):
        self._waiting: dict[str, list[str]] = {}  # module name -> the dotted names it defines

    def wait_for(self, module: str, dotted: str) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)
        self._waiting.setdefault(module, []).append(dotted)

    def find_spec(self, name, path=None, target=None):
        if name not in self._waiting:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(name, path, target) if find is not None else None
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            for dotted in self._waiting.pop(name, ()):
                _refuse_python_function(dotted, self)

        spec.loader.exec_module = exec_module  # this loader is this module's alone
        return spec
