"""The static scan: what it refuses in an exercise file, in which words, and
the honest code it leaves alone. Fast: it reads syntax trees, grades nothing."""

from __future__ import annotations

import ast
import textwrap

import pytest

from grader.catalog import ATTENTION_CALLS, CHAPTERS, MULTI_HEAD_CALLS, SOFTMAX_CALLS
from grader.notebooks import read_notebook
from grader.static_scan import forbidden_calls, refusal_message

EVERY_FORBIDDEN = SOFTMAX_CALLS + ATTENTION_CALLS + MULTI_HEAD_CALLS


def scan(source: str, exercise: str = "softmax", forbidden: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    return forbidden_calls(ast.parse(textwrap.dedent(source)), exercise, forbidden)


def first(source: str, exercise: str = "softmax", forbidden: tuple[str, ...] = ()) -> tuple[int, str]:
    found = scan(source, exercise, forbidden)
    assert found, "nothing found"
    return found[0]


# -- the messages --------------------------------------------------------------


def test_a_forbidden_call_says_the_exercise_asks_for_it():
    line, name = first("import torch\ndef softmax(x):\n    return torch.softmax(x, -1)\n",
                       forbidden=SOFTMAX_CALLS)
    assert refusal_message("softmax", name, f"line {line}") == (
        "softmax calls torch.softmax, which this exercise asks you to write yourself (line 3)")


def test_an_escape_hatch_is_named_with_its_line():
    line, name = first("import importlib\ndef softmax(x):\n    return x\n")
    assert refusal_message("softmax", name, f"line {line}") == (
        "softmax uses importlib (line 1): the grader refuses it in exercise files, since it can "
        "reach around the grader's checks; no exercise needs it")


def test_a_private_name_says_where_private_names_are_allowed():
    line, name = first("import torch\ndef softmax(x):\n    with torch._C.DisableTorchFunction():\n"
                       "        return x\n")
    assert refusal_message("softmax", name, f"line {line}") == (
        "softmax uses torch._C.DisableTorchFunction (line 3): the grader refuses private names "
        "(a leading _) in exercise files, except on self and cls, since they can reach around its "
        "checks; no exercise needs them")


def test_computed_code_is_named_as_written():
    line, name = first("import torch\ndef softmax(x, name):\n    return getattr(torch, name)(x)\n")
    assert refusal_message("softmax", name, "code cell 4 (softmax), line 2") == (
        "softmax uses getattr(torch, name) (code cell 4 (softmax), line 2): the grader refuses it in "
        "exercise files, since it can reach around the grader's checks; no exercise needs it")


# -- escape hatches --------------------------------------------------------------


ESCAPE_HATCHES = [
    # torch's internals, reached by their names or through an alias.
    ("import torch\ndef softmax(x):\n    with torch._C.DisableTorchFunction():\n        return x\n",
     (3, "torch._C.DisableTorchFunction")),
    ("import torch\nT = torch\ndef softmax(x):\n    return T._C._get_current_function_mode_stack()\n",
     (4, "torch._C._get_current_function_mode_stack")),
    ("import torch\ndef softmax(x):\n    m = torch\n    return m._C\n", (4, "torch._C")),
    ("import numpy, torch\ndef softmax(x):\n    a, b = numpy, torch\n    return b.ops.aten._softmax(x, -1, False)\n",
     (4, "torch.ops.aten._softmax")),
    ("import torch\ndef softmax(x):\n    return torch.ops.aten.exp(x)\n", (3, "torch.ops.aten.exp")),
    ("import torch\ndef softmax(x):\n    return torch.library.Library('aten', 'IMPL')\n",
     (3, "torch.library.Library")),
    ("from torch.overrides import TorchFunctionMode\ndef softmax(x):\n    return x\n",
     (1, "torch.overrides.TorchFunctionMode")),
    ("from torch.utils._python_dispatch import _pop_mode\ndef softmax(x):\n    return x\n",
     (1, "torch.utils._python_dispatch._pop_mode")),
    ("from torch._C import DisableTorchFunction\ndef softmax(x):\n    return x\n",
     (1, "torch._C.DisableTorchFunction")),
    ("import torch._dynamo\ndef softmax(x):\n    return x\n", (1, "torch._dynamo")),
    # Private names and mode switches on anything that is not self or cls.
    ("def softmax(x):\n    return x._C\n", (2, "x._C")),
    ("def softmax(x, guard):\n    with guard._disable_current_modes():\n        return x\n",
     (2, "guard._disable_current_modes")),
    ("def softmax(x, c):\n    with c.DisableTorchFunctionSubclass():\n        return x\n",
     (2, "c.DisableTorchFunctionSubclass")),
    # The interpreter's tables, frames and hooks.
    ("import sys\ndef softmax(x, name):\n    return sys.modules['torch.' + name]\n", (3, "sys.modules")),
    ("from sys import modules\ndef softmax(x):\n    return x\n", (1, "sys.modules")),
    ("import sys\ndef softmax(x):\n    return sys._getframe(1)\n", (3, "sys._getframe")),
    ("import sys\ndef softmax(x):\n    sys.settrace(None)\n", (3, "sys.settrace")),
    ("import sys\ndef softmax(x):\n    sys.setprofile(None)\n", (3, "sys.setprofile")),
    # Importing or running code by name.
    ("import importlib\ndef softmax(x):\n    return importlib.import_module('torch.' + 'overrides')\n",
     (1, "importlib")),
    ("def softmax(x):\n    import importlib\n    return importlib.import_module('torch.' + 'overrides')\n",
     (2, "importlib")),
    ("def softmax(x):\n    return __import__('torch').overrides\n", (2, "__import__")),
    ("def softmax(x):\n    exec('import torch')\n", (2, "exec")),
    ("def softmax(x):\n    return eval('x.exp()')\n", (2, "eval")),
    ("def softmax(x):\n    return compile('x', 'f', 'eval')\n", (2, "compile")),
    ("def softmax(x):\n    return globals()['torch']\n", (2, "globals")),
    ("import torch\ndef softmax(x):\n    return vars(torch)['_C']\n", (3, "vars")),
    ("def softmax(x):\n    return locals()\n", (2, "locals")),
    ("def softmax(x):\n    breakpoint()\n", (2, "breakpoint")),
    ("def softmax(x):\n    return __builtins__\n", (2, "__builtins__")),
    ("def softmax(x):\n    return __loader__\n", (2, "__loader__")),
    # getattr: a name computed on a module, or a literal one that names something refused.
    ("import torch\ndef softmax(x, name):\n    return getattr(torch, name)(x)\n", (3, "getattr(torch, name)")),
    ("import torch.nn.functional as F\ndef softmax(x, name):\n    f = F\n    return getattr(f, 'soft' + name)(x)\n",
     (4, "getattr(f, 'soft' + name)")),
    ("import torch\ndef softmax(x, name):\n    setattr(torch, name, None)\n", (3, "setattr(torch, name, None)")),
    ("import torch\ndef softmax(x, name):\n    delattr(torch, name)\n", (3, "delattr(torch, name)")),
    ("import torch\ndef softmax(x, name):\n    return hasattr(torch, name)\n", (3, "hasattr(torch, name)")),
    ("import torch\ndef softmax(x):\n    return getattr(torch, '_C')\n", (3, "torch._C")),
    ("import torch\ndef softmax(x):\n    return getattr(torch, '_' + 'C')\n", (3, "torch._C")),
    ("import torch\ndef softmax(x):\n    return getattr(torch, ''.join(['o', 'ps']))\n", (3, "torch.ops")),
    ("import torch\ndef softmax(x):\n    return getattr(getattr(torch, f\"{'_'}C\"), 'Disable' + 'TorchFunction')\n",
     (3, "torch._C.DisableTorchFunction")),
    ("def softmax(x):\n    look = getattr\n    return look(x, 'exp')()\n", (2, "getattr as a value")),
    ("def softmax(x, *pair):\n    return getattr(*pair)\n", (2, "getattr(*pair)")),
    # The interpreter's dunders and frames.
    ("def softmax(x):\n    return ().__class__.__mro__[1].__subclasses__()\n", (2, "().__class__.__mro__")),
    ("def softmax(x):\n    return object.__subclasses__()\n", (2, "object.__subclasses__")),
    ("def softmax(x):\n    return softmax.__globals__['torch']\n", (2, "softmax.__globals__")),
    ("import torch\ndef softmax(x):\n    return torch.__dict__['_C']\n", (3, "torch.__dict__")),
    ("def softmax(x):\n    return print.__self__\n", (2, "print.__self__")),
    ("def softmax(x, f):\n    return f.__wrapped__, f.__code__, f.__closure__\n", (2, "f.__closure__")),
    ("import torch\ndef softmax(x):\n    return object.__getattribute__(torch, 'ops')\n",
     (3, "object.__getattribute__")),
    ("def softmax(x):\n    return x.__reduce_ex__(2)\n", (2, "x.__reduce_ex__")),
    ("def softmax(x):\n    try:\n        1 / 0\n    except ZeroDivisionError as error:\n"
     "        return error.__traceback__.tb_frame.f_back.f_globals\n", 
     (5, "error.__traceback__.tb_frame.f_back.f_globals")),
    ("def softmax(x, frame):\n    return frame.f_back.f_locals\n", (2, "frame.f_back.f_locals")),
    ("def softmax(x, gen):\n    return gen.gi_frame\n", (2, "gen.gi_frame")),
    # torch's ways to other threads, processes and unpickled code.
    ("import torch\ndef softmax(x):\n    return torch.load('weights.pt', weights_only=False)\n",
     (3, "torch.load")),
    ("import torch.multiprocessing as mp\ndef softmax(x):\n    return x\n", (1, "torch.multiprocessing")),
]


@pytest.mark.parametrize("source, found", ESCAPE_HATCHES, ids=[name for _, (_, name) in ESCAPE_HATCHES])
def test_escape_hatches_are_refused(source, found):
    assert first(source) == found


@pytest.mark.parametrize("module", [
    "grader", "grader.catalog", "ctypes", "gc", "inspect", "importlib", "builtins", "os", "os.path",
    "subprocess", "socket", "signal", "multiprocessing", "threading", "_thread", "pty", "mmap",
    "resource", "pickle", "marshal", "shutil", "pathlib", "io", "traceback", "runpy", "__main__",
])
def test_modules_that_reach_the_grader_or_the_process_are_refused(module):
    assert first(f"import {module}\ndef softmax(x):\n    return x\n") == (1, module)
    assert first(f"def softmax(x):\n    from {module} import thing\n    return x\n") == (2, f"{module}.thing")


def test_the_notebooks_check_call_is_allowed_but_not_the_rest_of_the_grader():
    assert scan('from grader import check\ncheck("ch01")\ndef softmax(x):\n    return x\n') == []
    assert first("from grader import check\ndef softmax(x):\n    return check.__globals__\n") == (
        3, "grader.check.__globals__")
    assert first("from grader import remote\ndef softmax(x):\n    return x\n") == (1, "grader.remote")
    assert first("import grader\ngrader.check()\ndef softmax(x):\n    return x\n") == (1, "grader")


def test_a_refused_module_is_refused_where_it_is_used_too():
    assert scan("import inspect\ndef softmax(x):\n    return inspect.currentframe()\n") == [
        (1, "inspect"), (3, "inspect.currentframe")]


def test_escape_hatches_are_refused_where_nothing_is_forbidden():
    assert scan("import gc\ndef padding_mask(lengths):\n    return lengths\n", "padding_mask", ()) == [(1, "gc")]


# -- where the scan looks -------------------------------------------------------

TWO_EXERCISES = """
import torch

def _peek():
    import inspect
    return inspect.stack()

def softmax(x):
    _peek()
    return x

def softmax_numpy(x):
    return x
"""


def test_an_escape_hatch_in_a_function_costs_the_exercises_that_reach_it():
    assert scan(TWO_EXERCISES, "softmax") == [(5, "inspect"), (6, "inspect.stack")]
    assert scan(TWO_EXERCISES, "softmax_numpy") == []


def test_an_escape_hatch_at_module_level_costs_every_exercise():
    source = TWO_EXERCISES.replace("import torch\n", "import torch\nimport ctypes\n")
    assert scan(source, "softmax")[0] == (3, "ctypes")
    assert scan(source, "softmax_numpy") == [(3, "ctypes")]
    assert scan(source, "not_written_yet") == [(3, "ctypes")]


@pytest.mark.parametrize("runs_at_import", [
    "TABLE = _build()\n",
    "@_build\ndef unused():\n    pass\n",
    "def unused(table=_build()):\n    pass\n",
    "class Config:\n    table = _build()\n",
    "class Config(_build()):\n    pass\n",
], ids=["assignment", "decorator", "default", "class-body", "class-base"])
def test_helpers_that_run_at_import_cost_every_exercise(runs_at_import):
    source = ("def _build(*args):\n    exec('')\n\n" + runs_at_import
              + "\ndef softmax(x):\n    return x\n")
    assert scan(source) == [(2, "exec")]


def test_a_function_nothing_reaches_is_not_held_against_anyone():
    assert scan("def _unused():\n    exec('')\n\ndef softmax(x):\n    return x\n") == []


def test_forbidden_names_count_in_the_exercises_own_code_only():
    source = """
    import torch
    CHECK = torch.softmax(torch.zeros(3), 0)

    def _normalise(x):
        return torch.softmax(x, -1)

    def softmax(x):
        return _normalise(x)

    def other(x):
        return torch.softmax(x, -1)
    """
    assert scan(source, "softmax", SOFTMAX_CALLS) == [(6, "torch.softmax")]


# -- forbidden names: families and aliases ---------------------------------------------


def test_a_forbidden_name_forbids_what_is_below_it():
    source = "from torch import nn\ndef forward(q):\n    return nn.MultiheadAttention.forward(q)\n"
    assert scan(source, "forward", ("torch.nn.MultiheadAttention",)) == [
        (3, "torch.nn.MultiheadAttention.forward")]
    assert scan(source, "forward", ("torch.nn.Multihead",)) == []  # a family ends at a dot


NUMPY_FILE = """
import numpy as np
import torch

DTYPE = torch.float32

def softmax(x):
    return torch.softmax(x, -1)

def softmax_numpy(x):
    exps = np.exp(x - x.max(axis=-1, keepdims=True))
    return exps / exps.sum(axis=-1, keepdims=True)
"""


def test_a_forbidden_library_ignores_the_shared_imports():
    assert scan(NUMPY_FILE, "softmax_numpy", ("torch",)) == []


def test_a_forbidden_library_refuses_what_the_exercise_reaches_of_it():
    source = NUMPY_FILE.replace("    exps = np.exp(", "    x = torch.softmax(torch.from_numpy(x), -1).numpy()\n"
                                                     "    exps = np.exp(")
    assert scan(source, "softmax_numpy", ("torch",)) == [(11, "torch.from_numpy"), (11, "torch.softmax")]


@pytest.mark.parametrize("source, found", [
    ("import torch\nT = torch\ndef softmax(x):\n    return T.softmax(x, -1)\n", (4, "torch.softmax")),
    ("import torch\nsmooth = torch.softmax\ndef softmax(x):\n    return smooth(x, -1)\n",
     (4, "torch.softmax")),
    ("import torch\ndef softmax(x):\n    m = torch.nn.functional\n    return m.softmax(x, -1)\n",
     (4, "torch.nn.functional.softmax")),
    ("import torch.nn.functional as F\nF2 = F\ndef softmax(x):\n    return F2.log_softmax(x, -1).exp()\n",
     (4, "torch.nn.functional.log_softmax")),
    ("from torch.nn.functional import softmax as smooth\ndef softmax(x):\n    return smooth(x, -1)\n",
     (3, "torch.nn.functional.softmax")),
    ("import torch\ndef softmax(x):\n    return getattr(torch, 'soft' + 'max')(x, -1)\n", (3, "torch.softmax")),
    ("def softmax(x):\n    return x.softmax(-1)\n", (2, "torch.Tensor.softmax")),
    ("def softmax(x):\n    return getattr(x, 'soft' + 'max')(-1)\n", (2, "torch.Tensor.softmax")),
], ids=["T=torch", "sm=torch.softmax", "m=functional", "F2=F", "renamed-import", "folded-getattr",
        "method", "folded-method"])
def test_forbidden_names_are_found_through_aliases(source, found):
    assert first(source, forbidden=SOFTMAX_CALLS) == found


def test_a_name_computed_at_run_time_on_a_tensor_is_left_to_the_worker():
    source = "def softmax(x):\n    name = 'soft' + 'max'\n    return getattr(x, name)(-1)\n"
    assert scan(source, forbidden=SOFTMAX_CALLS) == []


# -- honest code ----------------------------------------------------------------


def course_sources():
    for chapter in CHAPTERS:
        yield pytest.param(chapter, chapter.solution().read_text(),
                           id=f"{chapter.id}-solution")
        yield pytest.param(chapter, chapter.stub().read_text(),
                           id=f"{chapter.id}-stub")
        yield pytest.param(chapter, read_notebook(chapter.notebook()).source,
                           id=f"{chapter.id}-notebook")


@pytest.mark.parametrize("chapter, source", course_sources())
def test_the_course_code_gives_no_finding(chapter, source):
    tree = ast.parse(source)
    found = {exercise.name: forbidden_calls(tree, exercise.name, exercise.forbidden)
             for exercise in chapter.exercises}
    assert found == {exercise.name: [] for exercise in chapter.exercises}


HONEST = {
    "nanogpt": """
        import math
        import torch
        import torch.nn as nn
        from torch.nn import functional as F

        class CausalSelfAttention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
                self.n_head = config.n_head
                self.n_embd = config.n_embd
                self.flash = hasattr(torch.nn.functional, "scaled_dot_product_attention")
                self.register_buffer("bias", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))
                self.apply(self._init_weights)

            def _init_weights(self, module):
                if isinstance(module, nn.Linear):
                    torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

            def forward(self, x):
                B, T, C = x.size()
                q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
                k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                return att @ v
    """,
    "hugging-face": """
        import torch

        def rotate_half(x):
            x1 = x[..., : x.shape[-1] // 2]
            x2 = x[..., x.shape[-1] // 2 :]
            return torch.cat((-x2, x1), dim=-1)

        def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
            batch, num_key_value_heads, slen, head_dim = hidden_states.shape
            if n_rep == 1:
                return hidden_states
            hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
            return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)
    """,
    "llama": """
        from typing import Tuple
        import torch

        def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0):
            freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
            t = torch.arange(end, device=freqs.device)
            freqs = torch.outer(t, freqs).float()
            return torch.polar(torch.ones_like(freqs), freqs)

        def apply_rotary_emb(xq: torch.Tensor, freqs_cis: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
            xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
            return torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)
    """,
    "annotated-transformer": """
        import copy
        import torch
        import torch.nn as nn

        def clones(module, N):
            return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])

        def subsequent_mask(size):
            attn_shape = (1, size, size)
            subsequent_mask = torch.triu(torch.ones(attn_shape), diagonal=1).type(torch.uint8)
            return subsequent_mask == 0
    """,
    "private-helpers-on-self": """
        import torch
        from torch import nn, Tensor

        class Rotary(nn.Module):
            def __init__(self):
                super().__init__()
                self._cache = {}

            def _shape(self, x: Tensor) -> Tensor:
                return x.view(2, -1)

            @classmethod
            def _norm(cls, x):
                return x / x.norm()

            def forward(self, x, name):
                layer = getattr(self, name)
                self.__dict__.update(seen=True)
                return self._norm(self._shape(x)), type(self).__name__, self.__class__.__name__, Rotary._norm(x)
    """,
    "config-getattr": """
        import math
        import torch

        def attention(q, k, config):
            heads = getattr(config, "n_head", 4)
            scale = getattr(config, "scale", None) or 1 / math.sqrt(q.shape[-1])
            scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
            return scores.masked_fill(scores < 0, torch.finfo(scores.dtype).min) / heads
    """,
    "modules-and-parameters": """
        import torch
        from torch import nn

        def parameter_count(model: nn.Module) -> int:
            for module in model.modules():
                if isinstance(module, nn.Linear):
                    module.reset_parameters()
            return sum(p.numel() for p in model.parameters() if p.requires_grad)
    """,
    "standard-library": """
        import dataclasses
        import functools
        import itertools
        import math
        import sys
        import warnings
        from dataclasses import dataclass, field
        from typing import Optional

        import numpy as np
        import torch

        @dataclass
        class Config:
            n_head: int = 4
            sizes: list = field(default_factory=list)

        @functools.lru_cache(maxsize=None)
        def offsets(n):
            return list(itertools.accumulate(range(n)))

        def attention_numpy(q, k, v, mask: Optional[np.ndarray] = None):
            if q.shape[-1] > 4096:
                warnings.warn("wide heads are slow", stacklevel=2)
            scores = q @ k.swapaxes(-2, -1) / np.sqrt(q.shape[-1])
            weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
            return weights / weights.sum(axis=-1, keepdims=True) @ v, dataclasses.asdict(Config())

        if __name__ == "__main__":
            print(attention_numpy(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2))), sys.argv)
    """,
    "aliases-of-public-modules": """
        import torch
        import torch.nn.functional as F

        act = F.gelu
        T = torch

        def mlp(x, w):
            linear, relu = F.linear, F.relu
            return act(linear(x, w)) + relu(x) + T.tanh(x)
    """,
    "tensor-subclass": """
        import torch

        class Tagged(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                return super().__torch_function__(func, types, args, kwargs or {})

        def tag(x):
            return x.as_subclass(Tagged)
    """,
    "own-names-like-builtins": """
        import re
        from re import compile as compile_pattern

        def compile(pattern):
            return compile_pattern(pattern)

        def tokens(text):
            return compile(r"\\w+").findall(text) + re.compile("x").findall(text)
    """,
    "training-loop": """
        import torch
        import torch.nn.functional as F

        def train(model, data, steps: int = 10):
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            model.train()
            for step in range(steps):
                logits = model(data[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            model.eval()
            with torch.no_grad():
                return loss.item()
    """,
}


@pytest.mark.parametrize("source", HONEST.values(), ids=HONEST.keys())
def test_honest_code_in_common_styles_gives_no_finding(source):
    tree = ast.parse(textwrap.dedent(source))
    names = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    assert {name: forbidden_calls(tree, name, EVERY_FORBIDDEN) for name in names} == {name: [] for name in names}


# -- robustness ----------------------------------------------------------------------


def deepest_parsable(make, terms: int = 20_000) -> ast.Module:
    """``make(terms)`` parsed, or with fewer terms where the parser itself
    runs out of recursion (it does on CPython 3.11 for 20,000)."""
    while True:
        try:
            return ast.parse(make(terms))
        except (RecursionError, MemoryError, SyntaxError):
            terms //= 2


@pytest.mark.parametrize("make, found", [
    (lambda n: "x = " + "+".join(["1"] * n) + "\ndef softmax(x):\n    return x\n", None),
    (lambda n: "def softmax(x):\n    return " + "+".join(["x"] * n) + "\n", None),
    (lambda n: "import torch\ndef softmax(x):\n    return torch" + ".a" * n + "._C\n", 3),
    (lambda n: "import torch\ndef softmax(x):\n    return getattr(torch, " + "+".join(["'_'"] * n) + ")\n", 3),
    (lambda n: "import torch\n" + "(" * n + "T" + ",)" * n + " = " + "(" * n + "torch" + ",)" * n
     + "\ndef softmax(x):\n    return T._C\n", 4),
], ids=["top-level-sum", "sum-in-exercise", "attribute-chain", "getattr-sum", "nested-tuples"])
def test_deep_trees_do_not_crash_the_scan(make, found):
    lines = [line for line, _ in forbidden_calls(deepest_parsable(make), "softmax", SOFTMAX_CALLS)]
    assert lines == ([found] if found else [])


def test_a_tree_deeper_than_any_parser_makes_does_not_crash_the_scan():
    tree = ast.parse("import torch\ndef softmax(x):\n    return x\n")
    chain = ast.Name("torch", ast.Load(), lineno=3, col_offset=11)
    for _ in range(100_000):
        chain = ast.Attribute(chain, "a", ast.Load(), lineno=3, col_offset=11)
    tree.body[1].body[0].value = ast.Attribute(chain, "_C", ast.Load(), lineno=3, col_offset=11)
    [(line, name)] = forbidden_calls(tree, "softmax", ())
    assert line == 3 and name == "torch" + ".a" * 100_000 + "._C"
