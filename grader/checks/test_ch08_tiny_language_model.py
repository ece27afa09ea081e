"""Hidden checks for chapter 8: a tiny causal language model.

``TransformerBlock`` and ``TinyLM`` are loaded with the same random weights
(by the ``state_dict`` names of their docstrings) as the reference and as an
oracle written from PyTorch's functions (``F.layer_norm``, ``F.linear``,
``F.scaled_dot_product_attention`` with ``is_causal=True``, ``F.gelu``), and
run on inputs whose last token is then changed: no earlier output may move.
On a mismatch, known wrong implementations are run on the same inputs and a
matching one's hint goes with the failure.

``train`` runs in the worker: 200 AdamW steps of the default small model on
the chapter's ``text.txt`` (about a second on one CPU thread). The loss
must fall from about ln(V) to below ``LEARNED``, and must not fall below
``SEES_THE_ANSWER``, which only a model that can see the token it predicts
reaches (no causal mask, or targets not shifted by one). The model ``train``
returns comes back as its ``state_dict``; the student's ``TinyLM``, loaded
with it, must not have the loss of an untrained model on the whole text.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from grader.bugs.ch08 import BUGS
from grader.catalog import COURSE_ROOT, find_chapter
from grader.checks import (
    case_ids,
    exercise,
    Oracles,
    portability_check,
    portable,
    reference_module_call,
    run,
    run_module,
)
from grader.compare import describe, expect_close, expect_true, fail, shape_text, unpack
from grader.module_calls import ModuleCall
from grader.wire import ModuleState

# The block and the model from PyTorch's functions (grader/oracles/ch08.py).
oracles = Oracles("ch08")

TEXT = COURSE_ROOT / "chapters" / find_chapter("ch08").folder / "text.txt"
TRAIN_STEPS = 200
TRAIN_CONTEXT, TRAIN_D_MODEL, TRAIN_HEADS = 32, 32, 2  # train's defaults, with one block
LEARNED = 2.3  # the reference ends near 1.8 for every seed
SEES_THE_ANSWER = 0.8  # a model that sees its target ends below 0.1
# train's failures are judged from its losses, not by running the known bugs (each would
# train for a second): every way the losses can be wrong names the bug it looks like.
HINTS = {bug.name: bug.hint for bug in BUGS if bug.exercise == "train"}


# -- weights in the course's names ------------------------------------------------------------


def _linear(inputs, prefix: str, d_out: int, d_in: int) -> dict:
    return {f"{prefix}.weight": inputs.randn(d_out, d_in) / d_in ** 0.5,
            f"{prefix}.bias": 0.1 * inputs.randn(d_out)}


def _norm(inputs, prefix: str, d_model: int) -> dict:
    """A LayerNorm's scale near 1 and shift near 0, but neither exactly."""
    return {f"{prefix}.weight": 1 + 0.1 * inputs.randn(d_model), f"{prefix}.bias": 0.1 * inputs.randn(d_model)}


def _block_state(inputs, d_model: int, prefix: str = "") -> dict:
    state = {}
    state.update(_norm(inputs, f"{prefix}ln1", d_model))
    state.update(_linear(inputs, f"{prefix}qkv", 3 * d_model, d_model))
    state.update(_linear(inputs, f"{prefix}proj", d_model, d_model))
    state.update(_norm(inputs, f"{prefix}ln2", d_model))
    state.update(_linear(inputs, f"{prefix}mlp.0", 4 * d_model, d_model))
    state.update(_linear(inputs, f"{prefix}mlp.2", d_model, 4 * d_model))
    return state


def _model_state(inputs, vocab_size: int, d_model: int, num_layers: int, context: int) -> dict:
    state = {"tok_emb.weight": inputs.randn(vocab_size, d_model), "pos_emb.weight": inputs.randn(context, d_model)}
    for layer in range(num_layers):
        state.update(_block_state(inputs, d_model, f"blocks.{layer}."))
    state.update(_norm(inputs, "ln_f", d_model))
    state.update(_linear(inputs, "head", vocab_size, d_model))
    return state


def _parameter_listing(shapes: dict) -> str:
    return ", ".join(f"{name} {shape_text(shape)}" for name, shape in sorted(shapes.items()))


def _expect_parameters(submission, name: str, recipe: ModuleCall, x, expected: dict) -> None:
    got, call = run_module(submission, name, recipe, x)
    _, state = unpack(got, ("output", "state"), call)
    if not isinstance(state, dict):
        fail(f"{call}: could not read the module's state_dict")
    found = {key: tuple(value.shape) for key, value in state.items() if hasattr(value, "shape")}
    expect_true(found == expected, f"{recipe.text(name)} has parameters {_parameter_listing(found) or 'none'}; "
                f"expected {_parameter_listing(expected)}")


def _expect_causal(submission, name: str, recipe: ModuleCall, x, changed, what: str) -> None:
    """The outputs at positions ``0 .. T - 2`` do not move when the last input changes."""
    before, call = run_module(submission, name, recipe, x)
    after, _ = run_module(submission, name, recipe, changed)
    for got in (before, after):
        if not isinstance(got, torch.Tensor) or got.dim() != 3 or tuple(got.shape[:2]) != tuple(x.shape[:2]):
            shape = f" of shape {shape_text(got.shape)}" if isinstance(got, torch.Tensor) else ""
            fail(f"{call} returned a {type(got).__name__}{shape}; expected a (B, T, ...) tensor for "
                 f"{what}s of shape {shape_text(x.shape)}")
    moved = float((before[:, :-1] - after[:, :-1]).abs().amax())
    if not moved <= 1e-5:
        fail(f"{call}: changing only the last {what} changed the outputs at earlier positions (by up to "
             f"{moved:.3g}); position t may see positions 0 .. t only: is the causal mask missing, "
             f"or does it hide the past instead of the future?")


# -- TransformerBlock ------------------------------------------------------------------------

# (id, B, T, D, H)
BLOCK_CASES = [
    ("B2-T5-D8-H2", 2, 5, 8, 2),
    ("B1-T7-D12-H3", 1, 7, 12, 3),
    ("B3-T4-D16-H4", 3, 4, 16, 4),
    ("B2-T1-D8-H1-one-token", 2, 1, 8, 1),
]


def _block_inputs(inputs, case):
    """``(x, state, recipe, H)`` for a case of BLOCK_CASES."""
    _, batch, length, d_model, num_heads = case
    x = inputs.randn(batch, length, d_model)
    state = _block_state(inputs, d_model)
    return x, state, ModuleCall(init_kwargs={"d_model": d_model, "num_heads": num_heads}, state=state), num_heads


@exercise("TransformerBlock")
@pytest.mark.parametrize("case", BLOCK_CASES, ids=case_ids(BLOCK_CASES))
def test_block_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference loaded with the same weights"""
    x, _, recipe, _ = _block_inputs(inputs, case)
    got, call = run_module(submission, "TransformerBlock", recipe, x)
    expect_close(got, reference_module_call(reference, "TransformerBlock", recipe, x), call,
                 bugs=bugs.module("TransformerBlock", recipe, x))


@exercise("TransformerBlock")
@pytest.mark.parametrize("case", BLOCK_CASES[:3], ids=case_ids(BLOCK_CASES[:3]))
def test_block_matches_pytorch(submission, bugs, inputs, case):
    """equals x + attn(LayerNorm(x)), then + MLP(LayerNorm(.)), from F.scaled_dot_product_attention(is_causal=True)"""
    x, state, recipe, num_heads = _block_inputs(inputs, case)
    got, call = run_module(submission, "TransformerBlock", recipe, x)
    expect_close(got, oracles.block(state, num_heads, x), call, bugs=bugs.module("TransformerBlock", recipe, x),
                 reference="F.layer_norm, F.linear, F.scaled_dot_product_attention(is_causal=True) and F.gelu")


@exercise("TransformerBlock")
def test_block_is_causal(submission, inputs):
    """changing the last token's input changes no earlier position's output"""
    x, _, recipe, _ = _block_inputs(inputs, ("B2-T6-D8-H2", 2, 6, 8, 2))
    changed = x.clone()
    changed[:, -1] = inputs.randn(2, 8)
    _expect_causal(submission, "TransformerBlock", recipe, x, changed, "input")


@exercise("TransformerBlock")
def test_block_parameters(submission, inputs):
    """has ln1, qkv (3D, D), proj (D, D), ln2, mlp.0 (4D, D) and mlp.2 (D, 4D), with biases"""
    d_model = 8
    recipe = ModuleCall(init_kwargs={"d_model": d_model, "num_heads": 2}, return_state=True)
    expected = {key: tuple(value.shape) for key, value in _block_state(inputs, d_model).items()}
    _expect_parameters(submission, "TransformerBlock", recipe, inputs.randn(2, 3, d_model), expected)


# -- TinyLM ----------------------------------------------------------------------------------

# (id, B, T, V, D, H, layers, context)
MODEL_CASES = [
    ("B2-T6-V11-D8-H2-L1-ctx8", 2, 6, 11, 8, 2, 1, 8),
    ("B3-T8-V7-D12-H3-L2-ctx8", 3, 8, 7, 12, 3, 2, 8),
    ("B1-T5-V20-D16-H4-L3-ctx10", 1, 5, 20, 16, 4, 3, 10),
]


def _model_inputs(inputs, case):
    """``(tokens, state, recipe, H, layers)`` for a case of MODEL_CASES."""
    _, batch, length, vocab_size, d_model, num_heads, num_layers, context = case
    tokens = torch.randint(vocab_size, (batch, length), generator=inputs.generator)  # (B, T)
    state = _model_state(inputs, vocab_size, d_model, num_layers, context)
    init = {"vocab_size": vocab_size, "d_model": d_model, "num_heads": num_heads, "num_layers": num_layers,
            "context": context}
    return tokens, state, ModuleCall(init_kwargs=init, state=state), num_heads, num_layers


@exercise("TinyLM")
@pytest.mark.parametrize("case", MODEL_CASES, ids=case_ids(MODEL_CASES))
def test_model_matches_reference(submission, reference, bugs, inputs, case):
    """gives the reference's logits (B, T, V) with the same weights"""
    tokens, _, recipe, _, _ = _model_inputs(inputs, case)
    got, call = run_module(submission, "TinyLM", recipe, tokens)
    expect_close(got, reference_module_call(reference, "TinyLM", recipe, tokens), call,
                 bugs=bugs.module("TinyLM", recipe, tokens))


@exercise("TinyLM")
@pytest.mark.parametrize("case", MODEL_CASES[:2], ids=case_ids(MODEL_CASES[:2]))
def test_model_matches_pytorch(submission, bugs, inputs, case):
    """equals embeddings + positions, the blocks, ln_f and head written with PyTorch's functions"""
    tokens, state, recipe, num_heads, num_layers = _model_inputs(inputs, case)
    got, call = run_module(submission, "TinyLM", recipe, tokens)
    expect_close(got, oracles.model(state, num_heads, num_layers, tokens), call,
                 bugs=bugs.module("TinyLM", recipe, tokens),
                 reference="F.embedding, PyTorch's causal attention blocks, F.layer_norm and F.linear")


@exercise("TinyLM")
def test_model_is_causal(submission, inputs):
    """changing the last token changes no earlier position's logits"""
    tokens, _, recipe, _, _ = _model_inputs(inputs, MODEL_CASES[1])
    changed = tokens.clone()
    changed[:, -1] = (tokens[:, -1] + 1) % 7
    _expect_causal(submission, "TinyLM", recipe, tokens, changed, "token")


@exercise("TinyLM")
def test_model_parameters(submission, inputs):
    """has tok_emb (V, D), pos_emb (context, D), blocks.0 .. blocks.L-1, ln_f and head (V, D)"""
    init = {"vocab_size": 11, "d_model": 8, "num_heads": 2, "num_layers": 2, "context": 8}
    recipe = ModuleCall(init_kwargs=init, return_state=True)
    expected = {key: tuple(value.shape) for key, value in _model_state(inputs, 11, 8, 2, 8).items()}
    tokens = torch.randint(11, (2, 5), generator=inputs.generator)
    _expect_parameters(submission, "TinyLM", recipe, tokens, expected)


# -- train -----------------------------------------------------------------------------------


def _text_tokens() -> tuple[torch.Tensor, int]:
    """The chapter's text as character ids ``(N,)``, and the number of characters."""
    text = TEXT.read_text(encoding="utf-8")
    alphabet = sorted(set(text))
    index = {char: i for i, char in enumerate(alphabet)}
    return torch.tensor([index[char] for char in text]), len(alphabet)


def _curve(losses: list[float]) -> str:
    marks = sorted({0, 25, 50, 100, 150, len(losses) - 1} & set(range(len(losses))))
    return ", ".join(f"step {step}: {losses[step]:.2f}" for step in marks)


def _trained(got, call: str, steps: int) -> tuple[ModuleState, list[float]]:
    """``train``'s ``(model, losses)``, or a failure that says what came back instead."""
    if isinstance(got, (list, tuple)) and len(got) == 2 and isinstance(got[1], ModuleState) and \
            not isinstance(got[0], ModuleState):
        fail(f"{call} returned ({describe(got[0])}, {describe(got[1])}); expected (model, losses), "
             f"the model first", hint=HINTS["model-and-losses-swapped"])
    if isinstance(got, (list, tuple)) and len(got) == steps and len(got) != 2:
        fail(f"{call} returned {describe(got)}; expected a tuple (model, losses): the trained TinyLM "
             f"and the list of losses")
    model, losses = unpack(got, ("model", "losses"), call)
    if not isinstance(model, ModuleState):
        fail(f"{call} returned {describe(model)} as its model; expected the trained TinyLM (an nn.Module)")
    if not isinstance(losses, (list, tuple)) or len(losses) != steps or \
            not all(type(loss) is float for loss in losses):
        kinds = sorted({type(loss).__name__ for loss in losses}) if isinstance(losses, (list, tuple)) else []
        fail(f"{call} returned losses {describe(losses)}"
             + (f" ({'/'.join(kinds)})" if kinds else "")
             + f"; expected a list of {steps} Python floats (loss.item() of each step)",
             hint=HINTS["loss-kept-as-tensor"] if any(isinstance(loss, torch.Tensor) for loss in
                                                      (losses if isinstance(losses, (list, tuple)) else ())) else None)
    return model, list(losses)


@exercise("train")
def test_train_returns_one_float_a_step_and_repeats_with_the_seed(submission):
    """returns one float a step, starting near ln(V), and the same losses for the same seed"""
    tokens, vocab_size = _text_tokens()
    got, call = run(submission, "train", tokens, vocab_size, 5, seed=3)
    _, losses = _trained(got, call, 5)
    start = math.log(vocab_size)
    if not abs(losses[0] - start) < 1.0:
        fail(f"{call}: the first loss is {losses[0]:.3f}; an untrained model guesses about uniformly, "
             f"a cross-entropy near ln({vocab_size}) = {start:.2f}")
    again, _ = run(submission, "train", tokens, vocab_size, 5, seed=3)
    _, losses_again = _trained(again, call, 5)
    if losses_again != losses:
        # The step where they part, not their values: code that seeds nothing draws from the
        # worker's random state, another at every grade, and the message should not change with it.
        first = next(step for step, (one, two) in enumerate(zip(losses, losses_again)) if one != two)
        fail(f"{call}, called twice, gave losses that differ from step {first}: call "
             f"torch.manual_seed(seed) first, before building the model and drawing the batches",
             hint=HINTS["not-seeded"])


@exercise("train")
def test_train_learns_the_text_without_seeing_the_answer(submission):
    """after 200 steps on text.txt the loss is below 2.3, and not near 0 (which only a model that sees its target reaches)"""
    tokens, vocab_size = _text_tokens()
    got, call = run(submission, "train", tokens, vocab_size, TRAIN_STEPS, seed=0)
    _, losses = _trained(got, call, TRAIN_STEPS)
    final = sum(losses[-10:]) / 10  # the mean of the last 10 steps: one batch is noisy
    if not math.isfinite(final) or final > LEARNED:
        # Gradients that pile up first help, then throw the weights about: the loss falls and
        # climbs back. With no step at all it never falls.
        climbed_back = min(losses) < final - 0.3
        fail(f"{call}: the loss of the last 10 steps is {final:.3f}, above {LEARNED} (the reference reaches "
             f"about 1.8); losses {_curve(losses)}. Is optimizer.step() called, and are the gradients "
             f"zeroed before each backward?",
             hint=HINTS["gradients-not-zeroed" if climbed_back else "no-optimizer-step"])
    if final < SEES_THE_ANSWER:
        fail(f"{call}: loss {final:.3f} is too low: the model sees the token it must predict (an honest "
             f"model of this text stays near 1.8 after {TRAIN_STEPS} steps); losses {_curve(losses)}. "
             f"Is the causal mask missing, or are the targets not the inputs shifted by one?",
             hint=HINTS["targets-not-shifted"])


@exercise("train")
def test_train_returns_the_model_it_trained(submission):
    """returns the model it trained: on text.txt it does not have the loss of an untrained model"""
    tokens, vocab_size = _text_tokens()
    got, call = run(submission, "train", tokens, vocab_size, 10, seed=1)
    model, losses = _trained(got, call, 10)
    # The returned weights go into the student's own TinyLM, so that a bug of TinyLM's or
    # of the block's is not blamed on train: only which model came back is judged here.
    state = {key: value for key, value in model.state.items() if isinstance(value, torch.Tensor)}
    init = {"vocab_size": vocab_size, "d_model": TRAIN_D_MODEL, "num_heads": TRAIN_HEADS, "num_layers": 1,
            "context": TRAIN_CONTEXT}
    windows, targets = oracles.text_windows(tokens, TRAIN_CONTEXT)  # (windows, context) each
    logits, model_call = run_module(submission, "TinyLM", ModuleCall(init_kwargs=init, state=state), windows)
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (*windows.shape, vocab_size):
        fail(f"{model_call} with the weights train returned gave {describe(logits)}; expected logits of "
             f"shape {shape_text((*windows.shape, vocab_size))}")
    loss = F.cross_entropy(logits.float().reshape(-1, vocab_size), targets.reshape(-1)).item()
    # Ten steps of AdamW at lr 1e-2 take the loss from about 3.6 to about 2.7, on a batch and
    # on the whole text alike. A model that was not trained (a copy made before the loop, a
    # new one) has about the loss training started from. One trained to do the wrong thing
    # (targets not shifted) can do worse than that: the learning check judges those.
    started, ended = losses[0], losses[-1]
    if ended < started - 0.5 and abs(loss - started) < 0.4:
        fail(f"{call}: the model returned has a loss of {loss:.3f} on text.txt, as an untrained one has, "
             f"but training went from {started:.3f} to {ended:.3f}: return the model the loop trained, "
             f"not a copy or a new one", hint=HINTS["fresh-model-returned"])


# -- every exercise -----------------------------------------------------------------------

test_would_run_on_a_gpu = portability_check([
    portable("TransformerBlock", lambda inputs: (
        (inputs.randn(2, 5, 8),), {"module": ModuleCall(init_kwargs={"d_model": 8, "num_heads": 2})})),
    portable("TinyLM", lambda inputs: (
        (torch.randint(11, (2, 5), generator=inputs.generator),),
        {"module": ModuleCall(init_kwargs={"vocab_size": 11, "d_model": 8, "num_heads": 2, "num_layers": 1,
                                           "context": 8})})),
    portable("train", lambda inputs: ((_text_tokens()[0][:200], _text_tokens()[1], 2), {})),
])
