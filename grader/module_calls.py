"""How a check calls an exercise that is an ``nn.Module`` class.

A class cannot cross between processes, so a check describes the call
instead: construct the class with these arguments, load this state, put it
in train or eval mode, seed the generator, call ``forward``. The same
recipe runs in the worker on the student's class and in the grader on the
reference's and the known bugs' classes, so all three are judged alike.
The recipe may also call another method than ``forward`` (``method``), or
hand the built module to one of the chapter's functions (``passed_to``):
``generate(model, prompt, num_tokens)`` needs the student's own model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grader import wire


@dataclass(frozen=True)
class ModuleCall:
    """Build ``Class(*init_args, **init_kwargs)`` and call it.

    Attributes:
        init_args, init_kwargs: the constructor's arguments (plain values).
        state: parameters to load before the call, by ``state_dict`` name
            (every parameter must be named; buffers of the module's own
            may stay unnamed), or None to keep its initial parameters.
        train: call in training mode (dropout active) rather than eval mode.
        seed: ``torch.manual_seed`` right before the call, for dropout.
        return_state: answer ``(forward's result, {name: parameter})``, so a
            check can see the module's parameter names and shapes.
        method: the method to call instead of ``forward`` (``module(...)``).
        passed_to: a function of the same namespace to call with the module
            first, ``passed_to(module, *args, **kwargs)``, instead of the
            module itself.
    """

    init_args: tuple = ()
    init_kwargs: dict = field(default_factory=dict)
    state: dict[str, torch.Tensor] | None = None
    train: bool = False
    seed: int | None = None
    return_state: bool = False
    method: str | None = None
    passed_to: str | None = None

    def encode(self) -> dict:
        """The recipe as plain data, for a request to the worker."""
        return {
            "init_args": wire.encode(list(self.init_args)),
            "init_kwargs": wire.encode(dict(self.init_kwargs)),
            "state": wire.encode(self.state),
            "train": bool(self.train),
            "seed": self.seed,
            "return_state": bool(self.return_state),
            "method": self.method,
            "passed_to": self.passed_to,
        }

    @classmethod
    def decode(cls, node: dict) -> ModuleCall:
        return cls(
            init_args=tuple(wire.decode(node["init_args"])),
            init_kwargs=wire.decode(node["init_kwargs"]),
            state=wire.decode(node["state"]),
            train=bool(node["train"]),
            seed=node["seed"] if type(node["seed"]) is int else None,
            return_state=bool(node["return_state"]),
            method=_name(node.get("method")),
            passed_to=_name(node.get("passed_to")),
        )

    def call_text(self, name: str, arguments: str) -> str:
        """``TransformerBlock(8, 2)(arguments)``, ``....forward_with_cache(arguments)``,
        or ``generate(TinyLM(...), arguments)``."""
        if self.passed_to:
            return f"{self.passed_to}({self.text(name)}{', ' if arguments else ''}{arguments})"
        return f"{self.text(name)}{'.' + self.method if self.method else ''}({arguments})"

    def text(self, name: str) -> str:
        """``MultiHeadAttention(d_model=8, num_heads=2)``, with ``.train()`` when training."""
        parts = [repr(value) for value in self.init_args]
        parts += [f"{key}={value!r}" for key, value in self.init_kwargs.items()]
        return f"{name}({', '.join(parts)})" + (".train()" if self.train else "")


def run_module_call(namespace: object, name: str, recipe: ModuleCall, args: list | tuple,
                    kwargs: dict, device: str | torch.device = "cpu"):
    """Follow ``recipe`` with the class ``name`` of ``namespace`` (a module).

    Raises the errors a student's class raises, and ``TypeError`` when the
    class does not make an ``nn.Module``.
    """
    cls = getattr(namespace, name)
    module = cls(*recipe.init_args, **recipe.init_kwargs)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{recipe.text(name)} is a {type(module).__name__}, not a torch.nn.Module")
    module = module.to(device)
    if recipe.state is not None:
        _expect_parameters(module, recipe.state, recipe.text(name))
        # Not strict: the student's own buffers keep their values (every
        # parameter was named above).
        module.load_state_dict({key: value.to(device) for key, value in recipe.state.items()},
                               strict=False)
    module.train(recipe.train)
    if recipe.seed is not None:
        torch.manual_seed(recipe.seed)
    if recipe.passed_to:
        result = getattr(namespace, recipe.passed_to)(module, *args, **kwargs)
    elif recipe.method:
        result = getattr(module, recipe.method)(*args, **kwargs)
    else:
        result = module(*args, **kwargs)
    if recipe.return_state:
        return result, {key: value.detach() for key, value in module.named_parameters()}
    return result


def _name(value: object) -> str | None:
    """A method's or function's name from a request: an identifier, or None."""
    return value if isinstance(value, str) and value.isidentifier() else None


def _expect_parameters(module: torch.nn.Module, state: dict[str, torch.Tensor], text: str) -> None:
    """Say in one line which names or shapes keep ``state`` from loading.

    Buffers of the student's own (a registered causal mask, say) that
    ``state`` does not name are theirs to keep; an extra parameter is not.
    """
    own = {key: tuple(value.shape) for key, value in module.state_dict().items()}
    missing = [key for key in state if key not in own]
    if missing:
        raise AttributeError(f"{text} has no parameter {', '.join(missing)} (it has "
                             f"{', '.join(own) or 'none'}): the grader loads weights by these names")
    extra = [key for key, _ in module.named_parameters() if key not in state]
    if extra:
        raise AttributeError(f"{text} has parameters the grader does not expect: {', '.join(extra)}")
    for key, value in state.items():
        if own[key] != tuple(value.shape):
            raise ValueError(f"{text}: {key} has shape {own[key]}, expected {tuple(value.shape)}")
