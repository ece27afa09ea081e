"""What the course contains: chapters, their exercises, points and rules.

This is the only list of chapters and exercises. The command line, the
build, the checks, the reports and every per-chapter test read it. A new
chapter starts with its entry in ``CHAPTERS``; grader/README.md's "Adding a
chapter" is the recipe for the rest, and ``mha-course new-chapter`` writes
a first draft of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# The course's folders sit beside the ``grader`` package, both in a checkout
# and in an editable install.
COURSE_ROOT = Path(__file__).resolve().parent.parent
# Each chapter's grading (checks, known bugs, oracles), in the package.
GRADING_DIR = Path(__file__).resolve().parent / "chapters"


def is_student_edition(root: Path = COURSE_ROOT) -> bool:
    """A student edition (``mha-course release``): recorded answers and no
    reference solutions. Cheap: ``--help`` asks it before torch is imported."""
    recordings = Path(__file__).resolve().parent / "recorded" / "index.json"
    return recordings.is_file() and not (root / "solutions").is_dir()


@dataclass(frozen=True)
class Exercise:
    """One function a student writes.

    Attributes:
        name: the function's name in the chapter's module.
        summary: a few words for tables.
        points: what passing every check of the exercise is worth.
        forbidden: dotted names of library functions (or classes, such as
            ``torch.nn.MultiheadAttention``) the exercise may not call: the
            thing it asks the student to write. Refused at run time by
            torch's dispatcher in the exercise's worker (``grader.refusals``,
            with ``KERNELS``); found in the exercise's source, a note.
        uses: earlier exercises of the same chapter that it builds on; when
            those fail too, the report says so.
        optional: an extension worth no points, graded when the student
            writes it: left as the stub (or absent from the file), it is
            "not attempted" and counts against nothing.
        preload: modules its correct code imports on its own, at a cost.
            A grade has them imported by a second fork server while the
            chapter's other checks run (``ForkServer.preloaded_copy``); a
            process that grades many submissions imports them once, before
            it forks (``grading.preload``).
    """

    name: str
    summary: str
    points: int
    forbidden: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    optional: bool = False
    preload: tuple[str, ...] = ()


@dataclass(frozen=True)
class Chapter:
    """A lesson with its exercises; ``slug`` names its files.

    ``extra_cost``: grading time beyond its checks' count, in checks (a
    chapter whose checks train a model); chapters graded side by side start
    with the costliest, so that none is left alone at the end.
    """

    number: int
    slug: str
    title: str
    exercises: tuple[Exercise, ...]
    extra_cost: int = 0

    @property
    def id(self) -> str:
        """Short id used on the command line: ``ch01``."""
        return f"ch{self.number:02d}"

    @property
    def module(self) -> str:
        """Stem of the solution and exercise files: ``ch01_self_attention``."""
        return f"{self.id}_{self.slug}"

    @property
    def folder(self) -> str:
        """Name of the lesson folder under ``chapters/``: ``01_self_attention``."""
        return f"{self.number:02d}_{self.slug}"

    def solution(self, root: Path = COURSE_ROOT) -> Path:
        """The reference solution: ``solutions/ch01_self_attention.py``."""
        return root / "solutions" / self.file_name

    def stub(self, root: Path = COURSE_ROOT) -> Path:
        """The student's file, as the build writes it: ``exercises/ch01_self_attention.py``."""
        return root / "exercises" / self.file_name

    def notebook(self, root: Path = COURSE_ROOT) -> Path:
        """The student's notebook: ``exercises/ch01_self_attention.ipynb``."""
        return root / "exercises" / f"{self.module}.ipynb"

    def lesson(self, root: Path = COURSE_ROOT) -> Path:
        """Its lesson: ``chapters/01_self_attention/README.md``."""
        return root / "chapters" / self.folder / "README.md"

    def grading(self, root: Path = COURSE_ROOT) -> Path:
        """Its grading's folder, the package ``package``: ``grader/chapters/ch01``."""
        return root / "grader" / "chapters" / self.id

    @property
    def package(self) -> str:
        """Its grading's package: ``grader.chapters.ch01``."""
        return f"grader.chapters.{self.id}"

    def bugs(self, root: Path = COURSE_ROOT) -> Path:
        """Its known bugs: ``grader/chapters/ch01/bugs.py``."""
        return self.grading(root) / "bugs.py"

    def oracles(self, root: Path = COURSE_ROOT) -> Path:
        """Its independent answers: ``grader/chapters/ch01/oracles.py``."""
        return self.grading(root) / "oracles.py"

    @property
    def file_name(self) -> str:
        """What its solution and its stub are called: ``ch01_self_attention.py``."""
        return f"{self.module}.py"

    @property
    def checks(self) -> Path:
        """Its hidden checks, in the installed package:
        ``grader/chapters/ch01/test_ch01_self_attention.py``."""
        return GRADING_DIR / self.id / f"test_{self.module}.py"

    @property
    def points(self) -> int:
        return sum(exercise.points for exercise in self.exercises)

    @property
    def preload(self) -> tuple[str, ...]:
        """What its exercises preload (``Exercise.preload``), and what its
        portability check's meta runs import (``META_RUN_PRELOAD``), each once."""
        return tuple(dict.fromkeys((*META_RUN_PRELOAD,
                                    *(name for exercise in self.exercises for name in exercise.preload))))

    def exercise(self, name: str) -> Exercise:
        for exercise in self.exercises:
            if exercise.name == name:
                return exercise
        raise KeyError(f"{self.id} has no exercise {name!r}")


# What a call on the meta device imports on its first run: torch's meta
# kernels written in Python check their arguments with sympy (about half a
# second). Every chapter's portability check makes such a call, in a worker
# forked from where the import was made once (``grading._preloaded_copy``).
META_RUN_PRELOAD = ("torch.fx.experimental.symbolic_shapes",)

SOFTMAX_CALLS = (
    "torch.softmax",
    "torch.Tensor.softmax",
    "torch.nn.functional.softmax",
    "torch.special.softmax",
    "torch.log_softmax",
    "torch.Tensor.log_softmax",
    "torch.nn.functional.log_softmax",
)
ATTENTION_CALLS = (
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.functional.multi_head_attention_forward",
)
# From chapter 2 on, students may call F.scaled_dot_product_attention and
# torch.softmax (chapter 1 graded their own), but not the library's whole
# multi-head attention, which chapters 3 to 5 ask them to write.
MULTI_HEAD_CALLS = (
    "torch.nn.functional.multi_head_attention_forward",
    "torch._native_multi_head_attention",
    "torch.nn.MultiheadAttention",
    "torch.ao.nn.quantizable.MultiheadAttention",  # a second one, written in Python
)

# Forbidden names that stand for a whole library: the exercises in NumPy may
# not hand their work to torch, nor may a count of parameters build a module,
# so the worker refuses every torch operator there.
WHOLE_LIBRARY = ("torch",)

# The operators behind the forbidden functions, which the worker refuses at
# torch's dispatcher (grader.refusals): every overload, on every dispatch key
# with a kernel. A forbidden function written in Python (F.softmax,
# F.multi_head_attention_forward, nn.MultiheadAttention's forward) refuses
# by itself as well, whatever operators it reaches.
#
# A softmax is computed by the softmax kernels, and inside the fused
# attention ones: scaled_dot_product_attention(q, eye, eye, scale=1) with q
# the logits is their softmax. SDPA's math path (torch >= 2.5) is
# _safe_softmax after a matrix product.
_SOFTMAX_OPERATORS = (
    "aten::_softmax", "aten::_log_softmax", "aten::_safe_softmax", "aten::_masked_softmax",
    "aten::_sparse_softmax", "aten::_sparse_log_softmax", "aten::_nested_tensor_softmax_with_shape",
    "quantized::softmax",
)
_FUSED_ATTENTION_OPERATORS = (
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_scaled_dot_product_attention_math_for_mps", "aten::_flash_attention_forward",
    "aten::_flash_attention_forward_no_dropout_inplace", "aten::_efficient_attention_forward",
    "aten::_cudnn_attention_forward", "aten::_triton_scaled_dot_attention",
)
_MULTI_HEAD_OPERATORS = (
    "aten::_native_multi_head_attention", "aten::_transformer_encoder_layer_fwd",
    "aten::_triton_multi_head_attention",
)
KERNELS = {
    **{name: _SOFTMAX_OPERATORS + _FUSED_ATTENTION_OPERATORS + _MULTI_HEAD_OPERATORS
       for name in SOFTMAX_CALLS},
    "torch.nn.functional.scaled_dot_product_attention": (
        ("aten::_safe_softmax",) + _FUSED_ATTENTION_OPERATORS + _MULTI_HEAD_OPERATORS),
    "torch._native_multi_head_attention": _MULTI_HEAD_OPERATORS,
}


CHAPTERS: tuple[Chapter, ...] = (
    Chapter(
        number=1,
        slug="self_attention",
        title="Scaled dot-product self-attention",
        exercises=(
            Exercise("softmax", "numerically stable softmax", 2, forbidden=SOFTMAX_CALLS),
            Exercise(
                "scaled_dot_product_attention",
                "attention with mask and scale",
                4,
                forbidden=ATTENTION_CALLS,
                uses=("softmax",),
            ),
            Exercise(
                "self_attention",
                "single-head self-attention",
                2,
                forbidden=ATTENTION_CALLS,
                uses=("scaled_dot_product_attention",),
            ),
            Exercise("softmax_numpy", "softmax in NumPy", 1, forbidden=("torch", "scipy.special.softmax")),
            Exercise(
                "scaled_dot_product_attention_numpy",
                "attention in NumPy",
                2,
                forbidden=("torch", "scipy.special.softmax"),
                uses=("softmax_numpy",),
            ),
        ),
    ),
    Chapter(
        number=2,
        slug="cross_attention",
        title="Cross-attention and padding masks",
        exercises=(
            Exercise("padding_mask", "padding mask from lengths", 1),
            Exercise("convert_mask", "mask conventions: attend, block, additive", 2),
            Exercise("combine_masks", "padding and attention masks for (B, H, L, S)", 2),
            Exercise(
                "cross_attention",
                "single-head cross-attention with padded context",
                3,
                uses=("padding_mask",),
            ),
        ),
    ),
    Chapter(
        number=3,
        slug="multi_head_attention",
        title="Multi-head attention",
        exercises=(
            Exercise("split_heads", "(..., T, D) to (..., H, T, d)", 1),
            Exercise("merge_heads", "(..., H, T, d) to (..., T, D)", 1),
            Exercise(
                "multi_head_attention",
                "functional multi-head attention",
                3,
                forbidden=MULTI_HEAD_CALLS,
                uses=("split_heads", "merge_heads"),
            ),
            Exercise(
                "MultiHeadAttention",
                "nn.Module with fused QKV, dropout, weights",
                3,
                forbidden=MULTI_HEAD_CALLS,
                uses=("split_heads", "merge_heads"),
            ),
            Exercise(
                "torch_multihead_forward",
                "nn.MultiheadAttention's forward from its weights",
                2,
                forbidden=MULTI_HEAD_CALLS,
                uses=("split_heads", "merge_heads"),
            ),
            # A formula: counting a library module's parameters is not one.
            Exercise("parameter_count", "parameters of the module", 1, forbidden=("torch",)),
        ),
    ),
    Chapter(
        number=4,
        slug="causal_attention",
        title="Causal attention and the KV cache",
        exercises=(
            Exercise("causal_mask", "bottom-right causal mask", 2),
            Exercise(
                "causal_self_attention",
                "causal multi-head self-attention with padding",
                3,
                forbidden=MULTI_HEAD_CALLS,
                uses=("causal_mask",),
            ),
            Exercise(
                "attend_with_cache",
                "incremental decoding with a KV cache",
                3,
                forbidden=MULTI_HEAD_CALLS,
                uses=("causal_mask",),
            ),
        ),
    ),
    Chapter(
        number=5,
        slug="rope",
        title="Rotary position embeddings (RoPE)",
        exercises=(
            Exercise("rope_angles", "angles: position times theta^(-2k/d)", 1),
            Exercise("apply_rope", "RoPE on adjacent pairs", 3, uses=("rope_angles",)),
            Exercise("apply_rope_half", "RoPE, rotate-half convention", 2, uses=("rope_angles",)),
            Exercise("adjacent_to_half_permutation", "the permutation between the two", 1),
            Exercise(
                "rope_self_attention",
                "causal multi-head self-attention with RoPE",
                3,
                forbidden=MULTI_HEAD_CALLS,
                uses=("apply_rope",),
            ),
        ),
    ),
    Chapter(
        number=6,
        slug="grouped_query_attention",
        title="Grouped-query and multi-query attention",
        # F.scaled_dot_product_attention stays allowed, as from chapter 2 on:
        # the catalog forbids whole functions, not one keyword (enable_gqa),
        # so grouped_query_attention also returns every query head's weights,
        # which that function does not give. Its grouping is the student's.
        exercises=(
            Exercise("expand_kv_heads", "K/V head h // group for every query head", 2),
            Exercise(
                "grouped_query_attention",
                "attention with H_kv shared K/V heads, and its weights",
                3,
                forbidden=MULTI_HEAD_CALLS,
                uses=("expand_kv_heads",),
            ),
            Exercise(
                "GroupedQueryAttention",
                "nn.Module with narrower k and v projections",
                3,
                forbidden=MULTI_HEAD_CALLS,
                uses=("expand_kv_heads", "grouped_query_attention"),
            ),
            Exercise("kv_cache_bytes", "bytes of the KV cache: MHA, GQA, MQA", 1),
        ),
    ),
    Chapter(
        number=7,
        slug="memory_efficient_attention",
        title="Memory-efficient attention (the idea behind FlashAttention)",
        # The chapter writes what torch.softmax and F.scaled_dot_product_attention
        # do, block by block: both are refused, kernels included.
        exercises=(
            Exercise("online_softmax", "softmax with a running max and sum", 2, forbidden=SOFTMAX_CALLS),
            Exercise(
                "tiled_attention",
                "attention over key blocks, never (L, S) scores",
                4,
                forbidden=SOFTMAX_CALLS + ATTENTION_CALLS,
            ),
            Exercise(
                "merge_attention",
                "two partial attentions into one, by log-sum-exp",
                2,
                forbidden=SOFTMAX_CALLS + ATTENTION_CALLS,
            ),
        ),
    ),
    Chapter(
        number=8,
        slug="tiny_language_model",
        title="Capstone: a tiny causal language model from your own parts",
        # The attention inside the block is the student's (chapters 3 and 4);
        # torch.softmax, F.scaled_dot_product_attention and F.cross_entropy are
        # allowed: they were earned in earlier chapters. train is not refused
        # anything, so its training steps run without the refusing modes' cost.
        # TransformerBlock and TinyLM each have a second path, forward_with_cache
        # (chapter 4's KV cache), graded with them; generate runs the student's
        # own TinyLM through it. RoPETransformerBlock, optional, is the block
        # with chapter 5's rotary embeddings: graded when written, no points.
        exercises=(
            Exercise(
                "TransformerBlock",
                "pre-norm causal self-attention and MLP, with residuals and a KV cache",
                5,
                forbidden=MULTI_HEAD_CALLS,
            ),
            Exercise(
                "TinyLM",
                "embeddings, blocks, final norm and head: logits (B, T, V), cached or not",
                4,
                forbidden=MULTI_HEAD_CALLS,
                uses=("TransformerBlock",),
            ),
            Exercise(
                "train",
                "next-token training with AdamW, the loss of every step",
                3,
                uses=("TinyLM",),
                # An optimizer imports torch._dynamo (and sympy) when it is built:
                # add_param_group is wrapped by torch._disable_dynamo, and step
                # imports it again for its graph break. Most of training's time.
                preload=("torch._dynamo",),
            ),
            Exercise(
                "generate",
                "greedy generation with the KV cache, equal to recomputing",
                3,
                forbidden=MULTI_HEAD_CALLS,
                uses=("TinyLM",),
            ),
            Exercise(
                "RoPETransformerBlock",
                "optional: the block with rotary embeddings, rotated from T_past with a cache",
                0,
                forbidden=MULTI_HEAD_CALLS,
                uses=("TransformerBlock",),
                optional=True,
            ),
            Exercise(
                "sample_next_token",
                "optional: sampling with temperature, top-k and top-p, under a seed",
                0,
                optional=True,
            ),
        ),
        extra_cost=60,  # its training checks (76 steps) cost about what 60 other checks do
    ),
    Chapter(
        number=9,
        slug="flash_backward",
        title="The backward pass of tiled attention",
        # The chapter writes attention's output and gradients block by block, as
        # chapter 7 wrote its output: torch.softmax and F.scaled_dot_product_attention
        # (whose autograd would give the gradients) are refused, kernels included.
        # FlashAttentionFunction is graded through the given flash_attention, its
        # apply, whose gradients the worker's own autograd computes (in float64, and
        # within the kernel's memory budget), and through the given
        # flash_attention_gradients, whose answers name its known bugs.
        exercises=(
            Exercise(
                "flash_attention_forward",
                "tiled attention's output and log-sum-exp",
                2,
                forbidden=SOFTMAX_CALLS + ATTENTION_CALLS,
            ),
            Exercise(
                "flash_attention_backward",
                "dq, dk, dv block by block, P rebuilt from lse",
                4,
                forbidden=SOFTMAX_CALLS + ATTENTION_CALLS,
            ),
            Exercise(
                "FlashAttentionFunction",
                "an autograd.Function saving q, k, v, out, lse",
                3,
                forbidden=SOFTMAX_CALLS + ATTENTION_CALLS,
                uses=("flash_attention_forward", "flash_attention_backward"),
            ),
        ),
    ),
    Chapter(
        number=10,
        slug="streaming_decoding",
        title="Bounded-memory decoding: sliding windows and attention sinks",
        # Masks and buffers are plain tensor code; the attention step may call
        # torch.softmax and F.scaled_dot_product_attention (earned in chapters 1
        # and 2), but not the library's whole multi-head attention.
        exercises=(
            Exercise("sliding_window_mask", "causal window of W keys plus sinks, bottom-right", 2),
            Exercise("rolling_cache_append", "token t into a fixed buffer: sinks kept, the rest a ring", 2),
            Exercise(
                "streaming_attention_step",
                "one decode step: append, RoPE at cache positions, attend to held slots",
                4,
                forbidden=MULTI_HEAD_CALLS,
                uses=("rolling_cache_append",),
            ),
        ),
    ),
    Chapter(
        number=11,
        slug="paged_kv_cache",
        title="A paged KV cache",
        # The chapter writes the bookkeeping of vLLM's PagedAttention (Kwon et
        # al. 2023): a free stack, block tables, and attention through them.
        # torch.softmax and F.scaled_dot_product_attention stay allowed, as from
        # chapter 2 on: the exercise is finding each sequence's keys, not the
        # softmax. append_to_pages builds on allocate_blocks.
        exercises=(
            Exercise("allocate_blocks", "take blocks off the free stack, the top first, or refuse", 2),
            Exercise(
                "append_to_pages",
                "one token a sequence into its pages, a new block only when the last is full",
                3,
                uses=("allocate_blocks",),
            ),
            Exercise(
                "paged_attention",
                "one query a sequence over its pages, through its block table",
                3,
                forbidden=MULTI_HEAD_CALLS,
            ),
        ),
    ),
    Chapter(
        number=12,
        slug="latent_attention",
        title="Multi-head latent attention",
        # The attention is the student's, as from chapter 3 on: torch.softmax and
        # F.scaled_dot_product_attention stay allowed (the decode's absorbed scores
        # are the student's either way), nn.MultiheadAttention is not.
        # absorbed_decode is handed the student's own module (ModuleCall's
        # passed_to) and reads its weights by their names.
        exercises=(
            Exercise(
                "MultiHeadLatentAttention",
                "nn.Module: latent K/V, decoupled RoPE key shared by the heads, causal",
                4,
                forbidden=MULTI_HEAD_CALLS,
            ),
            Exercise(
                "absorbed_decode",
                "one decode step over the latent cache, W_UK and W_UV absorbed",
                4,
                forbidden=MULTI_HEAD_CALLS,
                uses=("MultiHeadLatentAttention",),
            ),
            Exercise("latent_cache_bytes", "bytes of the latent + rope-key cache", 1),
        ),
    ),
)


class UnknownChapter(LookupError):
    """A command-line target that names no chapter."""


def find_chapter(target: str) -> Chapter:
    """The chapter a target names: ``ch01``, ``1``, ``01``, ``01_self_attention``,
    ``ch01_self_attention`` or ``self_attention`` all name chapter 1."""
    wanted = target.strip().lower()
    number = re.fullmatch(r"(?:ch)?(\d+)", wanted)
    for chapter in CHAPTERS:
        if wanted in {chapter.id, chapter.module, chapter.folder, chapter.slug}:
            return chapter
        if number and int(number.group(1)) == chapter.number:
            return chapter
    known = ", ".join(chapter.id for chapter in CHAPTERS)
    raise UnknownChapter(f"unknown chapter {target!r} (known: {known})")


SUBMISSION_SUFFIXES = (".py", ".ipynb")  # what can be graded: a file or a notebook


CHAPTER_IN_NAME = re.compile(r"(?<![a-z0-9])ch(\d+)")  # ``ch01`` in ``alice_ch01.py``, not ``rich01``


def gradescope_test_name(chapter: Chapter, exercise: Exercise) -> str:
    """An exercise's test in a Gradescope results.json (``report.results_json``
    and the 0-point tests of chapters not submitted): ``ch01 softmax: ...``."""
    return f"{chapter.id} {exercise.name}: {exercise.summary}"


def chapter_in_name(name: str) -> Chapter | None:
    """The chapter a file name gives with ``chNN`` as a word of it
    (``ch01_self_attention.py``, ``alice_ch01.ipynb``, ``Bob-CH3.py``), or
    None when it names none (``rich01.py``, ``attention.py``). The one rule
    for ``grade FILE``, ``check()`` in Jupyter, ``batch`` and Gradescope.

    Raises:
        UnknownChapter: the name gives a number the course has no chapter for.
    """
    match = CHAPTER_IN_NAME.search(name.lower())
    if match is None:
        return None
    for chapter in CHAPTERS:
        if chapter.number == int(match.group(1)):
            return chapter
    known = ", ".join(chapter.id for chapter in CHAPTERS)
    raise UnknownChapter(f"{name} names chapter {match.group(0)}, which the course does not have "
                         f"(known: {known})")


def chapter_for_file(path: Path) -> Chapter:
    """The chapter a submitted file belongs to, from its name
    (``chapter_in_name``); UnknownChapter when the name gives none."""
    chapter = chapter_in_name(path.name)
    if chapter is None:
        raise UnknownChapter(
            f"cannot tell which chapter {path.name} is for: name it like "
            f"{CHAPTERS[0].module}{path.suffix or '.py'}"
        )
    return chapter
