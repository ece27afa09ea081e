"""In the worker: refuse what an exercise asks the student to write.

These guards run in the worker, beside the student's code, so they are a
second line: the operating system (``grader.isolation``) is the boundary,
and the static scan (``grader.static_scan``) refuses, before anything runs,
the ways around them. What they catch is the honest mistake and the casual
cheat: a call of ``torch.softmax`` in the exercise that asks for a softmax,
``nn.MultiheadAttention`` in the one that asks for multi-head attention.

Three layers, each under the one before:

* ``ForbiddenCalls``: a torch-function mode that refuses the forbidden
  functions by identity (``torch.softmax``, ``F.softmax``, ``Tensor.softmax``);
* ``ForbiddenFamily``: the forbidden Python-level functions that have no
  kernel of their own (``F.multi_head_attention_forward`` is a composition
  of matrix products and a softmax) are replaced, for the call, by ones that
  refuse;
* ``ForbiddenKernels``: a dispatch mode that refuses the ATen kernels behind
  the forbidden functions (``aten::_softmax``), below every Python-level
  way around the first two, or every kernel at all where an exercise may
  not use torch (the NumPy exercises).

``intact`` tells, after each call, whether the guards are as the call found
them: a call that leaves a mode popped, torch functions turned off or a
guard's method replaced is refused.
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from grader.catalog import KERNELS, WHOLE_LIBRARY


class ForbiddenCalls(TorchFunctionMode):
    """Refuses the torch functions an exercise asks the student to write."""

    def __init__(self, banned: dict[object, str]):
        super().__init__()
        self.banned = banned
        self.used: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = self.banned.get(func)
        if name is not None:
            self.used = self.used or name  # recorded even if the student catches the error
            raise RuntimeError(f"{name} may not be used in this exercise")
        return func(*args, **(kwargs or {}))


class ForbiddenKernels(TorchDispatchMode):
    """Refuses the ATen kernels behind the forbidden functions, below every
    Python-level way around ``ForbiddenCalls`` (``torch.ops.aten._softmax``,
    ``torch._C.DisableTorchFunction``). With ``everything``, refuses every
    kernel: the exercise may not compute with torch at all."""

    def __init__(self, banned: dict[str, str], everything: str | None = None):
        super().__init__()
        self.banned = banned  # "aten::_softmax" -> "torch.softmax"
        self.everything = everything  # the forbidden name that refuses every kernel
        self.used: str | None = None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Else torch wraps the hook for torch.compile, whose first call imports
        # torch._dynamo, a costly import in every worker, for code nobody compiles.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if self.everything is not None:
            self.used = self.used or self.everything
            raise RuntimeError(f"{self.everything} may not be used in this exercise")
        if name in self.banned:
            kernel = name.replace("::", ".")
            self.used = self.used or f"{kernel} (the kernel of {self.banned[name]})"
            raise RuntimeError(f"{kernel} may not be used in this exercise")
        return func(*args, **(kwargs or {}))


class ForbiddenFamily:
    """For the call, replaces each forbidden Python-level function (one that
    has no kernel of its own to refuse) where the library keeps it, by one
    that refuses: ``F.multi_head_attention_forward``, also when it is reached
    under ``torch.nn.functional`` by ``nn.MultiheadAttention``."""

    def __init__(self, forbidden: list[str]):
        self.targets = []  # (owner, attribute name, original, dotted name)
        for dotted in forbidden:
            owner_name, _, attribute = dotted.rpartition(".")
            owner = resolve(owner_name)
            original = getattr(owner, attribute, None) if owner is not None else None
            if callable(original) and not isinstance(original, type) and dotted not in KERNELS:
                self.targets.append((owner, attribute, original, dotted))
        self.used: str | None = None

    def _refusing(self, dotted: str):
        def refused(*args, **kwargs):
            self.used = self.used or dotted
            raise RuntimeError(f"{dotted} may not be used in this exercise")

        return refused

    def __enter__(self) -> ForbiddenFamily:
        for owner, attribute, _, dotted in self.targets:
            setattr(owner, attribute, self._refusing(dotted))
        return self

    def __exit__(self, *exc) -> None:
        for owner, attribute, original, _ in self.targets:
            setattr(owner, attribute, original)


def resolve(dotted: str) -> object | None:
    """``"torch.nn.functional.softmax"`` -> the function, or None if absent."""
    module_name, _, rest = dotted.partition(".")
    target: object = sys.modules.get(module_name)
    for part in rest.split(".") if rest else ():
        target = getattr(target, part, None)
    return target


# The worker's mode classes, and their methods as their modules defined them:
# a class changed from inside the worker, at import or in any call, no longer guards.
_CLASSES: list[type] = []
_PRISTINE: dict[type, tuple] = {}


def watched(cls: type) -> type:
    """Class decorator: the worker's other modes (the footprint, the device
    tracker) are checked by ``intact`` as the guards are."""
    _CLASSES.append(cls)
    _PRISTINE[cls] = tuple(vars(cls).items())
    return cls


for _guard in (ForbiddenCalls, ForbiddenKernels, ForbiddenFamily):
    watched(_guard)


def state() -> tuple:
    """What a call must leave as it found it: the torch-function and dispatch
    mode stacks and whether torch functions are on. Compared before and
    after each call (``intact``)."""
    return (tuple(torch.overrides._get_current_function_mode_stack()),
            tuple(_get_current_dispatch_mode_stack()),
            torch._C._is_torch_function_enabled())


def intact(before: tuple) -> bool:
    """Did the call leave the guards as ``state()`` found them, and are the
    mode classes' methods still their own? A call that popped a mode,
    turned torch functions off or replaced a guard's method is refused."""
    return state() == before and all(tuple(vars(cls).items()) == _PRISTINE[cls] for cls in _CLASSES)


class Guards:
    """The guards one call runs under, built from the request's forbidden names."""

    def __init__(self, forbidden: list[str]):
        banned, kernels, everything = {}, {}, None
        for dotted in forbidden:
            if dotted in WHOLE_LIBRARY:
                everything = dotted
                continue
            target = resolve(dotted)
            if target is not None:
                banned[target] = dotted
            for kernel in KERNELS.get(dotted, ()):
                kernels.setdefault(kernel, dotted)
        # Each mode costs microseconds on every torch call: entered only when needed.
        self.calls = ForbiddenCalls(banned) if banned else None
        self.family = ForbiddenFamily(forbidden) if forbidden else None
        self.kernels = ForbiddenKernels(kernels, everything) if kernels or everything else None

    def enter(self, stack: contextlib.ExitStack) -> None:
        """Put the guards in force until ``stack`` closes."""
        for guard in (self.calls, self.family, self.kernels):
            if guard is not None:
                stack.enter_context(guard)

    @property
    def used(self) -> str | None:
        """The first forbidden thing the call reached, even if it caught the refusal."""
        return next((guard.used for guard in (self.calls, self.family, self.kernels)
                     if guard is not None and guard.used), None)
