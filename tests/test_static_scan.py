"""The static scan: where an exercise's own code names what it may not call,
the note that says so, and the honest code it leaves alone. Fast: it reads
syntax trees, grades nothing (tests/test_cheating.py grades what it notes)."""

from __future__ import annotations

import ast
import textwrap

import nbformat
import pytest

from grader.catalog import ATTENTION_CALLS, CHAPTERS, MULTI_HEAD_CALLS, SOFTMAX_CALLS, find_chapter
from grader.loading import load_submission
from grader.name_resolution import walk
from grader.notebooks import read_notebook
from grader.static_scan import Finding, forbidden_uses, note, notes

EVERY_FORBIDDEN = SOFTMAX_CALLS + ATTENTION_CALLS + MULTI_HEAD_CALLS
CH01 = find_chapter("ch01")


def scan(source: str, exercise: str = "softmax", forbidden: tuple[str, ...] = SOFTMAX_CALLS) -> list[tuple[int, str]]:
    """``[(line, name)]`` of what the scan finds."""
    return [(line, name) for line, name, _ in forbidden_uses(ast.parse(textwrap.dedent(source)), exercise, forbidden)]


def first(source: str, exercise: str = "softmax", forbidden: tuple[str, ...] = SOFTMAX_CALLS) -> tuple[int, str]:
    found = scan(source, exercise, forbidden)
    assert found, "nothing found"
    return found[0]


# -- the note --------------------------------------------------------------------


def test_a_forbidden_call_is_noted_as_what_the_exercise_asks_for():
    [finding] = forbidden_uses(ast.parse("import torch\ndef softmax(x):\n    return torch.softmax(x, -1)\n"),
                               "softmax", SOFTMAX_CALLS)
    assert finding == Finding(3, "torch.softmax", called=True)
    assert note(finding, "line 3", SOFTMAX_CALLS) == (
        "line 3 calls torch.softmax, which this exercise asks you to write yourself")


def test_a_forbidden_name_that_is_not_called_is_noted_as_used():
    [finding] = forbidden_uses(ast.parse("import functools, torch\ndef softmax(x):\n"
                                         "    return functools.partial(torch.softmax, dim=-1)(x)\n"),
                               "softmax", SOFTMAX_CALLS)
    assert finding == Finding(3, "torch.softmax", called=False)
    assert note(finding, "line 3", SOFTMAX_CALLS) == (
        "line 3 uses torch.softmax, which this exercise asks you to write yourself")


def test_a_torch_call_in_a_numpy_exercise_says_it_is_written_without_torch():
    forbidden = CH01.exercise("softmax_numpy").forbidden
    [finding] = forbidden_uses(ast.parse("import torch\ndef softmax_numpy(x, axis=-1):\n"
                                         "    return torch.from_numpy(x).numpy()\n"), "softmax_numpy", forbidden)
    assert note(finding, "line 3", forbidden) == (
        "line 3 calls torch.from_numpy: this exercise is written without torch")


def test_the_notes_of_a_file_name_its_lines_one_note_an_exercise(tmp_path):
    path = tmp_path / CH01.file_name
    path.write_text("import torch\nimport torch.nn.functional as F\n\n"
                    "def softmax(x, dim=-1):\n    F.log_softmax(x, dim)\n    return torch.softmax(x, dim)\n\n"
                    "def softmax_numpy(x, axis=-1):\n    return torch.tensor(x).numpy()\n", encoding="utf-8")
    assert notes(CH01, load_submission(path, CH01.module)) == {
        "softmax": "line 5 calls torch.nn.functional.log_softmax, which this exercise asks you to write yourself",
        "softmax_numpy": "line 9 calls torch.tensor: this exercise is written without torch",
    }
    assert notes(CH01, load_submission(path, CH01.module), only={"softmax_numpy"}).keys() == {"softmax_numpy"}


def test_a_notebooks_note_names_the_cell(tmp_path):
    notebook = nbformat.read(CH01.notebook(), as_version=4)
    cell = next(cell for cell in notebook.cells
                if cell.metadata.get("mha_course", {}).get("exercise") == "softmax")
    cell.source = "def softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n"
    path = tmp_path / f"{CH01.module}.ipynb"
    nbformat.write(notebook, path)
    submission = load_submission(path, CH01.module)
    definition = next(node for _, _, node in submission.statements if getattr(node, "name", "") == "softmax")
    where = submission.where(definition.body[0].lineno)
    assert where.startswith("code cell ") and where.endswith(", line 2")
    assert notes(CH01, submission) == {
        "softmax": f"{where} calls torch.softmax, which this exercise asks you to write yourself"}


# -- found through aliases, getattr with a literal name, helpers --------------------------


@pytest.mark.parametrize("source, found", [
    ("import torch\ndef softmax(x):\n    return torch.softmax(x, -1)\n", (3, "torch.softmax")),
    ("import torch\nT = torch\ndef softmax(x):\n    return T.softmax(x, -1)\n", (4, "torch.softmax")),
    ("import torch\nsmooth = torch.softmax\ndef softmax(x):\n    return smooth(x, -1)\n", (4, "torch.softmax")),
    ("import torch\ndef softmax(x):\n    m = torch.nn.functional\n    return m.softmax(x, -1)\n",
     (4, "torch.nn.functional.softmax")),
    ("import torch.nn.functional as F\nF2 = F\ndef softmax(x):\n    return F2.log_softmax(x, -1).exp()\n",
     (4, "torch.nn.functional.log_softmax")),
    ("from torch.nn.functional import softmax as smooth\ndef softmax(x):\n    return smooth(x, -1)\n",
     (3, "torch.nn.functional.softmax")),
    ("def softmax(x):\n    from torch import special\n    return special.softmax(x, -1)\n",
     (3, "torch.special.softmax")),
    ("import numpy, torch\ndef softmax(x):\n    a, b = numpy, torch\n    return b.log_softmax(x, -1).exp()\n",
     (4, "torch.log_softmax")),
    ("import torch\ndef softmax(x):\n    return getattr(torch, 'softmax')(x, -1)\n", (3, "torch.softmax")),
    ("import torch\ndef softmax(x):\n    return getattr(torch, 'soft' + 'max')(x, -1)\n", (3, "torch.softmax")),
    ("import torch\ndef softmax(x):\n    return getattr(torch, ''.join(['soft', 'max']), None)(x, -1)\n",
     (3, "torch.softmax")),
    ("import torch\ndef softmax(x):\n    return getattr(getattr(torch.nn, f\"{'func'}tional\"), 'softmax')(x, -1)\n",
     (3, "torch.nn.functional.softmax")),
    ("import torch\ndef softmax(x):\n    return torch.Tensor.softmax(x, -1)\n", (3, "torch.Tensor.softmax")),
], ids=["direct", "T=torch", "sm=torch.softmax", "m=functional", "F2=F", "renamed-import", "import-inside",
        "tuple-assignment", "getattr-literal", "getattr-folded", "getattr-joined-with-default",
        "getattr-nested", "Tensor.softmax-by-class"])
def test_forbidden_names_are_found_through_imports_and_aliases(source, found):
    assert first(source) == found


def test_a_forbidden_name_forbids_what_is_below_it():
    source = "from torch import nn\ndef forward(q):\n    return nn.MultiheadAttention.forward(q)\n"
    assert scan(source, "forward", ("torch.nn.MultiheadAttention",)) == [
        (3, "torch.nn.MultiheadAttention.forward")]
    assert scan(source, "forward", ("torch.nn.Multihead",)) == []  # a family ends at a dot


def test_forbidden_names_count_in_the_exercises_own_code_and_its_helpers_only():
    source = """
    import torch
    CHECK = torch.softmax(torch.zeros(3), 0)

    def _normalise(x):
        return torch.softmax(x, -1)

    class Stats:
        def normalised(self, x):
            return _normalise(x)

    def softmax(x):
        return Stats().normalised(x)

    def other(x):
        return torch.softmax(x, -1)

    def _unused(x):
        return torch.softmax(x, -1)
    """
    assert scan(source) == [(6, "torch.softmax")]
    assert scan(source, "other") == [(16, "torch.softmax")]
    assert scan(source, "not_written_yet") == []


def test_a_function_of_the_file_is_its_own_whatever_an_import_called_it():
    # Imported under the exercise's name to compare with, then written: the def is what runs.
    source = """
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    def scaled_dot_product_attention(q, k, v):
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        return torch.softmax(scores, dim=-1) @ v

    def self_attention(x, w):
        return scaled_dot_product_attention(x @ w, x @ w, x @ w)
    """
    assert scan(source, "self_attention", ATTENTION_CALLS) == []


# -- what it does not judge --------------------------------------------------------------


@pytest.mark.parametrize("source", [
    "def softmax(x):\n    return x.softmax(-1)\n",
    "def softmax(x):\n    return getattr(x, 'soft' + 'max')(-1)\n",
    "def softmax(x):\n    name = 'soft' + 'max'\n    return getattr(x, name)(-1)\n",
    "import torch\ndef softmax(x, name='softmax'):\n    return getattr(torch, name)(x, -1)\n",
], ids=["method", "method-by-literal", "method-by-computed-name", "computed-getattr-on-torch"])
def test_methods_and_computed_names_are_left_to_the_worker(source):
    # The source cannot tell a tensor's method from one of the student's own
    # objects, nor a computed name's value: the worker refuses the call when it runs.
    assert scan(source) == []


def test_a_method_of_the_students_own_named_like_a_tensor_method_is_not_noted():
    source = """
    import torch

    class RunningStats:
        def softmax(self, x):
            exps = torch.exp(x - x.amax(-1, keepdim=True))
            return exps / exps.sum(-1, keepdim=True)

    def softmax(x):
        stats = RunningStats()
        return stats.softmax(x)
    """
    assert scan(source) == []


def test_code_that_never_runs_is_not_read():
    source = """
    import typing
    from typing import TYPE_CHECKING

    import torch

    if TYPE_CHECKING:
        from torch.nn.functional import softmax as checked_softmax

    def softmax(x, dim=-1):
        if TYPE_CHECKING:
            reveal_type(torch.softmax(x, dim))
        if typing.TYPE_CHECKING:
            reveal_type(checked_softmax(x, dim))
        else:
            exps = torch.exp(x - x.amax(dim, keepdim=True))
        return exps / exps.sum(dim, keepdim=True)

    if __name__ == "__main__":
        smooth = torch.softmax
        print(softmax(torch.randn(3)), torch.softmax(torch.randn(3), 0))
    """
    assert scan(source) == []
    assert first(source.replace("exps = torch.exp(", "exps = torch.softmax(")) == (16, "torch.softmax")


def test_the_walk_leaves_out_the_bodies_that_never_run_and_keeps_their_else():
    tree = ast.parse(textwrap.dedent("""
        if __name__ == "__main__":
            main_only = 1
        elif "__main__" == __name__:
            never = 2
        else:
            imported = 3
        if typing.TYPE_CHECKING:
            checking = 4
        if __name__ != "__main__":
            runs = 5
    """))
    names = {node.id for node in walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    assert names == {"imported", "runs"}


def test_of_a_whole_library_only_calls_are_noted():
    source = """
    from dataclasses import dataclass

    import numpy as np
    import torch

    @dataclass
    class Config:
        dtype: torch.dtype = torch.float32
        axis: int = -1

    def softmax_numpy(x, config: Config = Config()):
        if isinstance(x, torch.Tensor):
            raise TypeError("softmax_numpy takes a NumPy array")
        exps = np.exp(x - x.max(axis=config.axis, keepdims=True))
        return exps / exps.sum(axis=config.axis, keepdims=True)
    """
    assert scan(source, "softmax_numpy", ("torch",)) == []
    computed = source.replace("        exps = np.exp(", "        x = torch.as_tensor(x).double().numpy()\n"
                                                     "        exps = np.exp(")
    assert scan(computed, "softmax_numpy", ("torch",)) == [(15, "torch.as_tensor")]


# -- honest code -----------------------------------------------------------------------


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
    found = {exercise.name: forbidden_uses(tree, exercise.name, exercise.forbidden)
             for exercise in chapter.exercises}
    assert found == {exercise.name: [] for exercise in chapter.exercises}


HONEST = {
    "nanogpt": """
        import inspect
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

            def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
                fused_available = "fused" in inspect.signature(torch.optim.AdamW).parameters
                extra_args = dict(fused=True) if fused_available and device_type == "cuda" else dict()
                return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, **extra_args)

            def forward(self, x):
                B, T, C = x.size()
                q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
                k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                return att @ v
    """,
    "notebook-setup-and-files": """
        import io
        import os
        import pathlib
        import sys
        import traceback

        os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "TRUE")
        import torch

        HERE = pathlib.Path.cwd()

        def log_failure(x):
            buffer = io.StringIO()
            try:
                x.exp()
            except Exception:
                kind, error, _ = sys.exc_info()
                traceback.print_exc(file=buffer)
            return buffer.getvalue()

        def softmax(x, dim=-1):
            log_failure(x)
            exps = torch.exp(x - x.amax(dim=dim, keepdim=True))
            return exps / exps.sum(dim=dim, keepdim=True)
    """,
    "vars-and-locals": """
        import torch

        def softmax(x, dim=-1):
            shift = x.amax(dim=dim, keepdim=True)
            exps = torch.exp(x - shift)
            state = dict(locals())
            return exps / exps.sum(dim=dim, keepdim=True), sorted(vars(torch.nn.Linear(2, 2)))
    """,
    "hugging-face-private-config": """
        from collections import namedtuple

        import torch
        from torch import nn

        Output = namedtuple("Output", "attn_output attn_weights")

        class MultiHeadAttention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.config = config
                self._num_heads = config.num_attention_heads

            def merge(self, other):
                return self._num_heads + other._num_heads

            def forward(self, hidden_states):
                if self.config._attn_implementation == "eager":
                    out = hidden_states * self._num_heads
                else:
                    out = hidden_states
                result = Output(out, None)
                return result._replace(attn_weights=torch.zeros(1))
    """,
    "activation-by-name": """
        import torch
        import torch.nn.functional as F

        def mlp(x, w, activation_name="gelu"):
            act = getattr(F, activation_name)
            return act(x @ w)

        def activation_module(name="GELU"):
            return getattr(torch.nn, name)()
    """,
    "torch-load-in-main-and-a-type-checking-import": """
        from __future__ import annotations

        from typing import TYPE_CHECKING

        import torch

        if TYPE_CHECKING:
            from torch.nn.functional import scaled_dot_product_attention as Reference

        def scaled_dot_product_attention(q, k, v):
            scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
            weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
            return weights / weights.sum(dim=-1, keepdim=True) @ v

        if __name__ == "__main__":
            q, k, v = torch.load("inputs.pt", weights_only=False)
            print(scaled_dot_product_attention(q, k, v), torch.softmax(q, -1))
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
    "aliases-of-public-modules": """
        import torch
        import torch.nn.functional as F

        act = F.gelu
        T = torch

        def mlp(x, w):
            linear, relu = F.linear, F.relu
            return act(linear(x, w)) + relu(x) + T.tanh(x)
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
    assert {name: forbidden_uses(tree, name, EVERY_FORBIDDEN) for name in names} == {name: [] for name in names}


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
    (lambda n: "import torch\ndef softmax(x):\n    return torch" + ".nn" * n + ".softmax(x)\n", None),
    (lambda n: "import torch\ndef softmax(x):\n    return getattr(torch, " + "+".join(["'_'"] * n) + ")\n", None),
    (lambda n: "import torch\n" + "(" * n + "T" + ",)" * n + " = " + "(" * n + "torch" + ",)" * n
     + "\ndef softmax(x):\n    return T.softmax(x)\n", 4),
    (lambda n: "import torch\ndef softmax(x):\n    return " + "torch.exp(" * n + "torch.softmax(x)" + ")" * n + "\n", 3),
], ids=["top-level-sum", "sum-in-exercise", "attribute-chain", "getattr-sum", "nested-tuples", "nested-calls"])
def test_deep_trees_do_not_crash_the_scan(make, found):
    lines = [line for line, _, _ in forbidden_uses(deepest_parsable(make), "softmax", SOFTMAX_CALLS)]
    assert lines == ([found] if found else [])


def test_a_tree_deeper_than_any_parser_makes_does_not_crash_the_scan():
    tree = ast.parse("import torch\ndef softmax(x):\n    return x\n")
    chain = ast.Name("torch", ast.Load(), lineno=3, col_offset=11)
    for _ in range(100_000):
        chain = ast.Attribute(chain, "a", ast.Load(), lineno=3, col_offset=11)
    tree.body[1].body[0].value = ast.Call(chain, [], [], lineno=3, col_offset=11)
    [(line, name, called)] = forbidden_uses(tree, "softmax", ("torch",))
    assert line == 3 and called and name == "torch" + ".a" * 100_000


def test_a_file_with_a_byte_order_mark_is_scanned_on_its_own_lines(tmp_path):
    """Some Windows editors save a UTF-8 byte-order mark first; Python reads past it, and so does the scan."""
    path = tmp_path / CH01.file_name
    path.write_bytes(b"\xef\xbb\xbfimport torch\r\n\r\ndef softmax(x, dim=-1):\r\n\treturn torch.softmax(x, dim)\r\n")
    assert notes(CH01, load_submission(path, CH01.module)) == {
        "softmax": "line 4 calls torch.softmax, which this exercise asks you to write yourself"}
