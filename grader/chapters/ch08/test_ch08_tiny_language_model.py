"""Hidden checks for chapter 8: a tiny causal language model.

``TransformerBlock`` and ``TinyLM`` are loaded with the same random weights
(by the ``state_dict`` names of their docstrings) as the reference and as an
oracle written from PyTorch's functions (``F.layer_norm``, ``F.linear``,
``F.scaled_dot_product_attention`` with ``is_causal=True``, ``F.gelu``), and
run on inputs whose last token is then changed: no earlier output may move.
On a mismatch, known wrong implementations are run on the same inputs and a
matching one's hint goes with the failure.

Each module's ``forward_with_cache`` (chapter 4's KV cache) is run on the
last tokens of a sequence, with the keys and values of the earlier ones as
the oracle computes them: its output must be the last rows of the whole
sequence's, and the cache it returns the oracle's keys and values of every
token, the new ones appended. ``TinyLM`` fed a chunk and then one token at a
time, each time with the cache it returned, must give its own ``forward``'s
logits. ``generate`` runs the student's own ``TinyLM`` (``ModuleCall``'s
``passed_to``): its tokens and logits must be what running the whole
sequence again at every step gives, both in the oracle (no cache) and in
the student's own ``TinyLM``; an argmax tie (two logits within float32's
tolerance) may go either way.

``RoPETransformerBlock`` (optional, no points) is checked as the block is,
against an oracle that rotates queries and keys as Meta's llama does (as
complex numbers); with a cache, the new tokens must be rotated from
``T_past`` and the cache must hold the rotated keys.

``train`` runs in the worker: 60 AdamW steps of the default small model, with
a context of 8 and a learning rate of 0.02, on the chapter's ``text.txt``.
The loss must fall from about ln(V) to below ``LEARNED``, and must not fall
below ``SEES_THE_ANSWER``, which only a model that can see the token it
predicts reaches (no causal mask, or targets not shifted by one). The model ``train``
returns comes back as its ``state_dict``; the student's ``TinyLM``, loaded
with it, must not have the loss of an untrained model on the whole text.
"""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from grader.chapters.ch08.bugs import BUGS
from grader.catalog import COURSE_ROOT, find_chapter
from grader.checks import (
    case_ids,
    exercise,
    expect_finite,
    expect_module_matches_reference,
    NO_KEY,
    Oracles,
    portability_check,
    portable,
    run,
    run_module,
)
from grader.compare import (
    TOLERANCES,
    CheckFailure,
    describe,
    expect_close,
    expect_true,
    fail,
    matches,
    matching_hint,
    shape_text,
    unpack,
)
from grader.module_calls import ModuleCall
from grader.relations import RelationHint
from grader.wire import ModuleState

# The block and the model from PyTorch's functions (oracles.py).
oracles = Oracles("ch08")

TEXT = COURSE_ROOT / "chapters" / find_chapter("ch08").folder / "text.txt"
# The learning check: 60 steps with a context of 8 and a learning rate of 0.02 (train's
# arguments; the model is train's default, D = 32, 2 heads, 1 block, batches of 16) tell an
# honest model from every way of training wrong, at a tenth of the default 200 steps' cost
# (32 tokens a window and lr 0.01 need over 100 steps for a block without its causal mask
# to fall below an honest model). The mean loss of the last 10 steps, measured on one
# thread and on two (they differ by at most 0.004), seeds 0 to 5 (the check uses seed 0):
#   the reference and the 7 correct styles of tests/correct_styles  2.28 .. 2.62 (seed 0: 2.29 .. 2.58)
#   gradients-not-zeroed (it falls to 2.6 .. 2.9, then climbs)      3.94 .. 5.23 (seed 0: 4.51)
#   no-optimizer-step (about ln 32 = 3.47, on each batch)           3.58 .. 3.73 (seed 0: 3.62)
#   the block without its causal mask (TransformerBlock's bug)      0.40 .. 0.47 (seed 0: 0.40)
#   targets-not-shifted                                             0.001 .. 0.022 (seed 0: 0.022)
# LEARNED 3.1 is 0.48 above the slowest honest model and 0.47 below the lowest no-step;
# SEES_THE_ANSWER 1.3 is 0.83 above the no-mask block and 0.97 below the fastest honest model.
# Rising again by CLIMBED_BACK 0.6 over the lowest step tells unzeroed gradients (1.32 .. 2.44
# above their lowest) from no step at all (0.09 .. 0.16 above it, batches' noise).
TRAIN_STEPS = 60
TRAIN_SETTINGS = {"context": 8, "lr": 2e-2}  # passed to train, beside steps and seed
LEARNED = 3.1  # the reference ends near 2.3
SEES_THE_ANSWER = 1.3  # a model that sees its target ends below 0.5
CLIMBED_BACK = 0.6
# No step at all leaves the first 10 steps' mean and the last 10's within the batches' noise
# (0.01 to 0.04 apart, seeds 0 to 5); plain SGD at this rate moves it by 0.35 to 0.41, and so
# is not told it takes no step.
FLAT = 0.2
# The returned-model check trains with train's defaults.
TRAIN_CONTEXT, TRAIN_D_MODEL, TRAIN_HEADS = 32, 32, 2  # train's defaults, with one block
TRAIN_BATCH = 16  # train's default batch_size
# train's failures are judged from its losses, not by running the known bugs (each would
# train a model): every way the losses can be wrong names the bug it looks like.
HINTS = {bug.name: bug.hint for bug in BUGS if bug.exercise == "train"}
PROBABILITIES = RelationHint("your losses stay where a cross-entropy of probabilities must, whatever the weights: "
                             "is a softmax applied before F.cross_entropy, which takes logits and applies its own?",
                             "probabilities")


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
    for got in (before, after):
        expect_finite(got[:, :-1], f"{call} at the positions before the last", NO_KEY)
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
    expect_module_matches_reference(submission, reference, bugs, "TransformerBlock", recipe, x)


@exercise("TransformerBlock")
@pytest.mark.parametrize("case", BLOCK_CASES[:3], ids=case_ids(BLOCK_CASES[:3]))
def test_block_matches_pytorch(submission, bugs, inputs, case):
    """equals x + attn(LayerNorm(x)), then + MLP(LayerNorm(.)), from F.scaled_dot_product_attention(is_causal=True)"""
    x, state, recipe, num_heads = _block_inputs(inputs, case)
    got, call = run_module(submission, "TransformerBlock", recipe, x)
    expect_close(got, oracles.block(state, num_heads, x), call,
                 lookalikes=bugs.module("TransformerBlock", recipe, x),
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


# -- the KV cache, shared by the block's and the model's checks ---------------------------------


def _parts(lookalikes, *path):
    """The known bugs' outputs at ``output[path[0]][path[1]]...``, as
    ``expect_close`` takes them; a bug whose output has no such part is left out."""
    def outputs():
        for hint, output in lookalikes():
            try:
                for index in path:
                    output = output[index]
            except Exception:  # None, a tensor where a tuple was due, a recorded fingerprint
                continue
            yield hint, output
    return outputs


def _expect_cache(got, expected: tuple, what: str, lookalikes, path: tuple = ()) -> None:
    """One block's returned cache ``(k, v)`` equals ``expected``, keys first."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(f"{what} is {describe(got)}; expected a tuple (k, v) of two (B, H, T_past + T, d) tensors",
             hint=matching_hint(got, _parts(lookalikes, *path)))
    for index, name in enumerate(("keys", "values")):
        expect_close(got[index], expected[index], f"the {name} of {what}",
                     lookalikes=_parts(lookalikes, *path, index),
                     reference="the oracle's keys and values of the whole sequence, the cached tokens first")


# -- TransformerBlock with a KV cache ---------------------------------------------------------------

# (id, B, T_past, T, D, H): T_past 0 is a call without a cache
BLOCK_CACHE_CASES = [
    ("B2-past0-T4-D8-H2-no-cache", 2, 0, 4, 8, 2),
    ("B1-past5-T1-D12-H3-one-token", 1, 5, 1, 12, 3),
    ("B2-past3-T3-D8-H2-a-chunk", 2, 3, 3, 8, 2),
]


@exercise("TransformerBlock")
@pytest.mark.parametrize("case", BLOCK_CACHE_CASES, ids=case_ids(BLOCK_CACHE_CASES))
def test_block_with_cache_gives_the_whole_sequences_last_rows(submission, bugs, inputs, case):
    """forward_with_cache(x, cache) gives the last rows of the block on the whole sequence, and the cache with the new keys and values appended"""
    _, batch, past, length, d_model, num_heads = case
    x = inputs.randn(batch, past + length, d_model)  # (B, T_past + T, D): the whole sequence
    state = _block_state(inputs, d_model)
    keys, values = oracles.block_keys_values(state, num_heads, x)  # (B, H, T_past + T, d) each
    recipe = ModuleCall(init_kwargs={"d_model": d_model, "num_heads": num_heads}, state=state,
                        method="forward_with_cache")
    args = (x[:, past:],) if past == 0 else (x[:, past:], (keys[:, :, :past], values[:, :, :past]))
    got, call = run_module(submission, "TransformerBlock", recipe, *args)
    lookalikes = bugs.module("TransformerBlock", recipe, *args)
    output, cache = unpack(got, ("output", "cache"), call)
    expect_close(output, oracles.block(state, num_heads, x)[:, past:], f"output of {call}",
                 lookalikes=_parts(lookalikes, 0),
                 reference=f"the last {length} rows of the block on all {past + length} positions (PyTorch's "
                           f"functions, F.scaled_dot_product_attention(is_causal=True))")
    _expect_cache(cache, (keys, values), f"the cache {call} returned", lookalikes, (1,))


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
    expect_module_matches_reference(submission, reference, bugs, "TinyLM", recipe, tokens)


@exercise("TinyLM")
@pytest.mark.parametrize("case", MODEL_CASES[:2], ids=case_ids(MODEL_CASES[:2]))
def test_model_matches_pytorch(submission, bugs, inputs, case):
    """equals embeddings + positions, the blocks, ln_f and head written with PyTorch's functions"""
    tokens, state, recipe, num_heads, num_layers = _model_inputs(inputs, case)
    got, call = run_module(submission, "TinyLM", recipe, tokens)
    expect_close(got, oracles.model(state, num_heads, num_layers, tokens), call,
                 lookalikes=bugs.module("TinyLM", recipe, tokens),
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


# (id, B, T_past, T, V, D, H, layers, context): T_past 0 is a call without a cache
MODEL_CACHE_CASES = [
    ("B2-past0-T5-V11-D8-H2-L2-ctx8-no-cache", 2, 0, 5, 11, 8, 2, 2, 8),
    ("B1-past7-T1-V13-D12-H3-L2-ctx8-one-token", 1, 7, 1, 13, 12, 3, 2, 8),
    ("B2-past3-T4-V7-D8-H2-L1-ctx10-a-chunk", 2, 3, 4, 7, 8, 2, 1, 10),
]


def _model_recipe(inputs, vocab_size, d_model, num_heads, num_layers, context, **options):
    """``(state, recipe)``: random weights for a TinyLM and the recipe that loads them."""
    state = _model_state(inputs, vocab_size, d_model, num_layers, context)
    init = {"vocab_size": vocab_size, "d_model": d_model, "num_heads": num_heads, "num_layers": num_layers,
            "context": context}
    return state, ModuleCall(init_kwargs=init, state=state, **options)


@exercise("TinyLM")
@pytest.mark.parametrize("case", MODEL_CACHE_CASES, ids=case_ids(MODEL_CACHE_CASES))
def test_model_with_cache_gives_the_whole_sequences_last_rows(submission, bugs, inputs, case):
    """forward_with_cache(tokens, cache) puts the new tokens at positions T_past.. and gives the whole sequence's last logits, and every block's grown cache"""
    _, batch, past, length, vocab_size, d_model, num_heads, num_layers, context = case
    tokens = torch.randint(vocab_size, (batch, past + length), generator=inputs.generator)  # (B, T_past + T)
    state, recipe = _model_recipe(inputs, vocab_size, d_model, num_heads, num_layers, context,
                                  method="forward_with_cache")
    caches = oracles.model_keys_values(state, num_heads, num_layers, tokens)  # one (k, v) a block
    args = ((tokens[:, past:],) if past == 0 else
            (tokens[:, past:], [(k[:, :, :past], v[:, :, :past]) for k, v in caches]))
    got, call = run_module(submission, "TinyLM", recipe, *args)
    lookalikes = bugs.module("TinyLM", recipe, *args)
    logits, grown = unpack(got, ("logits", "cache"), call)
    expect_close(logits, oracles.model(state, num_heads, num_layers, tokens)[:, past:], f"logits of {call}",
                 lookalikes=_parts(lookalikes, 0),
                 reference=f"the last {length} positions of the model on all {past + length} tokens "
                           f"(PyTorch's functions)")
    if not isinstance(grown, (tuple, list)) or len(grown) != num_layers:
        fail(f"{call} returned {describe(grown)} as its cache; expected a list of {num_layers} (k, v) "
             f"tuples, one a block", hint=matching_hint(grown, _parts(lookalikes, 1)))
    for layer, (block_cache, expected) in enumerate(zip(grown, caches)):
        _expect_cache(block_cache, expected, f"the cache of blocks[{layer}] {call} returned", lookalikes, (1, layer))


@exercise("TinyLM")
def test_model_fed_a_token_at_a_time_gives_its_own_forward(submission, inputs):
    """fed 3 tokens, then one token at a time with the cache each call returns, it gives forward's logits"""
    batch, length, vocab_size, num_heads = 2, 7, 11, 2
    tokens = torch.randint(vocab_size, (batch, length), generator=inputs.generator)  # (B, T)
    _, recipe = _model_recipe(inputs, vocab_size, 8, num_heads, 2, 8)
    whole, whole_call = run_module(submission, "TinyLM", recipe, tokens)
    if not isinstance(whole, torch.Tensor) or tuple(whole.shape) != (batch, length, vocab_size):
        fail(f"{whole_call} returned {describe(whole)}; expected logits of shape "
             f"{shape_text((batch, length, vocab_size))}")
    expect_finite(whole, whole_call, NO_KEY, nan_only=True)
    stepped = dataclasses.replace(recipe, method="forward_with_cache")
    cache, start = None, 0
    for stop in range(3, length + 1):  # a chunk of 3 tokens, then one at a time
        args = (tokens[:, start:stop],) if cache is None else (tokens[:, start:stop], cache)
        got, call = run_module(submission, "TinyLM", stepped, *args)
        logits, cache = unpack(got, ("logits", "cache"), call)
        expect_close(logits, whole[:, start:stop],
                     f"{call}, after tokens 0 .. {start - 1} went in through the cache it returned," if start
                     else call,
                     reference=f"your own {whole_call} at positions {start} .. {stop - 1} (cached and "
                               f"recomputed must agree)")
        start = stop


# -- train -----------------------------------------------------------------------------------


def _text_tokens() -> tuple[torch.Tensor, int]:
    """The chapter's text as character ids ``(N,)``, and the number of characters."""
    text = TEXT.read_text(encoding="utf-8")
    alphabet = sorted(set(text))
    index = {char: i for i, char in enumerate(alphabet)}
    return torch.tensor([index[char] for char in text]), len(alphabet)


def _curve(losses: list[float]) -> str:
    marks = sorted({0, 15, 30, 45, len(losses) - 1} & set(range(len(losses))))
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
    got, call = run(submission, "train", tokens, vocab_size, 3, seed=3)
    _, losses = _trained(got, call, 3)
    start = math.log(vocab_size)
    if not abs(losses[0] - start) < 1.0:
        # About ln(V) for each of a default batch's positions: the loss summed, not averaged.
        summed = 0.8 < losses[0] / (start * TRAIN_BATCH * TRAIN_CONTEXT) < 1.25
        fail(f"{call}: the first loss is {losses[0]:.3f}; an untrained model guesses about uniformly, "
             f"a cross-entropy near ln({vocab_size}) = {start:.2f}",
             hint=RelationHint(f"your first loss is about {TRAIN_BATCH} x {TRAIN_CONTEXT} times ln(V), once for "
                               f"each position of a batch: is the loss summed (reduction=\"sum\") where its "
                               f"mean belongs?", "factor") if summed else None)
    again, _ = run(submission, "train", tokens, vocab_size, 3, seed=3)
    _, losses_again = _trained(again, call, 3)
    if losses_again != losses:
        # The step where they part, not their values: code that seeds nothing draws from the
        # worker's random state, another at every grade, and the message should not change with it.
        first = next(step for step, (one, two) in enumerate(zip(losses, losses_again)) if one != two)
        fail(f"{call}, called twice, gave losses that differ from step {first}: call "
             f"torch.manual_seed(seed) first, before building the model and drawing the batches",
             hint=HINTS["not-seeded"])


@exercise("train")
def test_train_learns_the_text_without_seeing_the_answer(submission):
    """after 60 steps on text.txt (context 8, lr 0.02) the loss is below 3.1, and not below 1.3 (which only a model that sees its target reaches)"""
    tokens, vocab_size = _text_tokens()
    got, call = run(submission, "train", tokens, vocab_size, TRAIN_STEPS, seed=0, **TRAIN_SETTINGS)
    _, losses = _trained(got, call, TRAIN_STEPS)
    final = sum(losses[-10:]) / 10  # the mean of the last 10 steps: one batch is noisy
    # The hints read the curve of a mean cross-entropy. One that is not (negative, or far from
    # ln(V) before any step: another loss) says nothing of how training went wrong.
    cross_entropy = all(loss >= 0 for loss in losses) and abs(losses[0] - math.log(vocab_size)) < 1.0
    if not math.isfinite(final) or final > LEARNED:
        # Gradients that pile up first help, then throw the weights about: the loss falls and
        # climbs back. With no step at all it never falls: it stays within the batches' noise.
        climbed_back = min(losses) < final - CLIMBED_BACK
        flat = abs(sum(losses[:10]) / 10 - final) < FLAT
        # Probabilities passed as logits (a softmax before F.cross_entropy, which applies its own)
        # give ln(sum_j exp(p_j)) - p_target, within [ln V + 1/V - 1, ln(V - 1 + e)] whatever the
        # weights (sum_j p_j = 1): a curve inside those bounds from the first step to the last is that
        # loss, not the untrained model of no step at all (its losses 3.46 to 3.82 at V = 32, seeds 0
        # to 3, over the bound 3.52; a softmax first: 3.17 to 3.47).
        probabilities = all(math.log(vocab_size) + 1 / vocab_size - 1 <= loss <= math.log(vocab_size - 1 + math.e)
                            for loss in losses)
        hint = HINTS["gradients-not-zeroed"] if climbed_back else PROBABILITIES if probabilities else \
            HINTS["no-optimizer-step"] if flat else None
        fail(f"{call}: the loss of the last 10 steps is {final:.3f}, above {LEARNED} (the reference reaches "
             f"about 2.3); losses {_curve(losses)}. Is optimizer.step() called, and are the gradients "
             f"zeroed before each backward?", hint=hint if cross_entropy else None)
    if final < 0:
        fail(f"{call}: the losses go below 0 ({_curve(losses)}); a cross-entropy never does: is the loss "
             f"F.cross_entropy of the logits?")
    if final < SEES_THE_ANSWER:
        fail(f"{call}: loss {final:.3f} is too low: the model sees the token it must predict (an honest "
             f"model of this text stays near 2.3 after {TRAIN_STEPS} steps); losses {_curve(losses)}. "
             f"Is the causal mask missing, or are the targets not the inputs shifted by one?",
             hint=HINTS["targets-not-shifted"] if cross_entropy else None)


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


# -- generate ---------------------------------------------------------------------------------

# (id, B, T0, N, V, D, H, layers, context)
GENERATE_CASES = [
    ("B2-T3-N4-V11-D8-H2-L2-ctx8", 2, 3, 4, 11, 8, 2, 2, 8),
    ("B1-T1-N7-V13-D12-H3-L1-ctx8-to-the-context", 1, 1, 7, 13, 12, 3, 1, 8),
    ("B3-T5-N3-V7-D8-H2-L2-ctx10", 3, 5, 3, 7, 8, 2, 2, 10),
]


def _generated(got, call: str, batch: int, prompt_length: int, num_tokens: int, vocab_size: int,
               lookalikes=None):
    """``generate``'s ``(tokens, logits)``, or a failure that says what came back instead."""
    tokens, logits = unpack(got, ("tokens", "logits"), call)
    hint = matching_hint(got, lookalikes)
    for name, value, shape, dtype in (("tokens", tokens, (batch, prompt_length + num_tokens), torch.int64),
                                      ("logits", logits, (batch, num_tokens, vocab_size), torch.float32)):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape or value.dtype != dtype:
            fail(f"{call} returned {name} {describe(value)}; expected {shape_text(shape)} "
                 f"{str(dtype).removeprefix('torch.')}", hint=hint)
    return tokens, logits


def _tie(logits: torch.Tensor) -> torch.Tensor:
    """``(...,)``: how far below the largest of each row of logits ``(..., V)`` a logit may be and
    still tie with it. Two correct answers differ by up to twice float32's tolerance: where the
    two largest logits are that close, argmax may pick either (rounding decides)."""
    rtol, atol = TOLERANCES[torch.float32]
    return 2 * (atol + rtol * logits.abs().amax(dim=-1))


def _off_the_top(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``(...,)`` bool: is the logit of each token ``(...,)`` further below its row's largest
    than a tie (or the token not in the vocabulary)?"""
    vocab_size = logits.shape[-1]
    picked = logits.gather(-1, tokens.clamp(0, vocab_size - 1)[..., None])[..., 0]
    return (tokens < 0) | (tokens >= vocab_size) | (picked < logits.amax(dim=-1) - _tie(logits))


@exercise("generate")
@pytest.mark.parametrize("case", GENERATE_CASES, ids=case_ids(GENERATE_CASES))
def test_generate_equals_recomputing_the_whole_sequence(submission, bugs, inputs, case):
    """gives the tokens and logits of greedy generation that runs the whole sequence again at every step"""
    _, batch, prompt_length, num_tokens, vocab_size, d_model, num_heads, num_layers, context = case
    prompt = torch.randint(vocab_size, (batch, prompt_length), generator=inputs.generator)  # (B, T0)
    state, recipe = _model_recipe(inputs, vocab_size, d_model, num_heads, num_layers, context,
                                  passed_to="generate")
    got, call = run_module(submission, "TinyLM", recipe, prompt, num_tokens)
    lookalikes = bugs.module("TinyLM", recipe, prompt, num_tokens)
    tokens, logits = _generated(got, call, batch, prompt_length, num_tokens, vocab_size, lookalikes)
    expected_tokens, expected_logits = oracles.greedy(state, num_heads, num_layers, prompt, num_tokens)
    reference = "greedy generation without a cache: the model (PyTorch's functions) on the whole sequence, every step"
    if not torch.equal(tokens[:, :prompt_length], prompt):
        fail(f"{call}: the first {prompt_length} tokens returned are not the prompt; tokens is the prompt, then "
             f"the new tokens", hint=matching_hint(got, lookalikes))
    for step in range(num_tokens):
        where = prompt_length + step
        try:
            expect_close(logits[:, step], expected_logits[:, step],
                         f"logits of new token {step} (position {where}) of {call}", reference=reference)
        except CheckFailure as failure:  # the known bugs' whole answers, never a slice of them
            failure.hint = matching_hint(got, lookalikes)
            raise
        mine, right = tokens[:, where], expected_tokens[:, where]  # (B,)
        if torch.equal(mine, right):
            continue
        off = _off_the_top(expected_logits[:, step], mine)  # (B,)
        if not bool(off.any()):
            return  # a tie went the other way: from here on another sequence, as right
        row = int(off.nonzero()[0])
        fail(f"{call}: new token {step} (position {where}) of sequence {row} is {int(mine[row])}, but its logits "
             f"are largest at {int(right[row])}: the next token is their argmax, over the vocabulary",
             hint=matching_hint(got, lookalikes))


@exercise("generate")
@pytest.mark.parametrize("case", GENERATE_CASES[:2], ids=case_ids(GENERATE_CASES[:2]))
def test_generate_agrees_with_your_own_model(submission, bugs, inputs, case):
    """each new token's logits are your TinyLM's on the sequence before it, and the token is their argmax"""
    _, batch, prompt_length, num_tokens, vocab_size, d_model, num_heads, num_layers, context = case
    prompt = torch.randint(vocab_size, (batch, prompt_length), generator=inputs.generator)  # (B, T0)
    state, recipe = _model_recipe(inputs, vocab_size, d_model, num_heads, num_layers, context)
    generating = dataclasses.replace(recipe, passed_to="generate")
    got, call = run_module(submission, "TinyLM", generating, prompt, num_tokens)
    # A generate that gives the right answer is not the bug here (the student's forward is):
    # no known bug's hint, as the edition, which keeps no bug whose answer is the right one.
    right = matches(got, oracles.greedy(state, num_heads, num_layers, prompt, num_tokens))
    lookalikes = bugs.module("TinyLM", generating, prompt, num_tokens)  # asked always: the edition records it
    lookalikes = None if right else lookalikes
    tokens, logits = _generated(got, call, batch, prompt_length, num_tokens, vocab_size, lookalikes)
    if not torch.equal(tokens[:, :prompt_length], prompt):
        fail(f"{call}: the first {prompt_length} tokens returned are not the prompt; tokens is the prompt, then "
             f"the new tokens", hint=matching_hint(got, lookalikes))
    # Causal: the logits at position t of the final sequence are those of the sequence up to t.
    whole, whole_call = run_module(submission, "TinyLM", recipe, tokens[:, :-1])
    if not isinstance(whole, torch.Tensor) or tuple(whole.shape) != (batch, prompt_length + num_tokens - 1, vocab_size):
        fail(f"{whole_call} returned {describe(whole)}; expected logits of shape "
             f"{shape_text((batch, prompt_length + num_tokens - 1, vocab_size))}")
    expect_finite(whole[:, prompt_length - 1:], f"{whole_call}[:, {prompt_length - 1}:]", NO_KEY,
                  hint=matching_hint(got, lookalikes), nan_only=True)
    try:
        expect_close(logits, whole[:, prompt_length - 1:], f"logits of {call}",
                     reference=f"your own {whole_call} at the positions before each new token (cached and "
                               f"recomputed must agree)")
    except CheckFailure as failure:
        failure.hint = matching_hint(got, lookalikes)
        if right:
            failure.message += ("; generate's answer is right, so your TinyLM's forward disagrees with its "
                                "forward_with_cache")
        raise
    new = tokens[:, prompt_length:]  # (B, N)
    wrong = _off_the_top(logits, new)  # (B, N)
    if bool(wrong.any()):
        row, step = (int(i) for i in wrong.nonzero()[0])
        fail(f"{call}: new token {step} of sequence {row} is {int(new[row, step])}, but the logits it came with "
             f"are largest at {int(logits[row, step].argmax())}: greedy generation takes their argmax",
             hint=matching_hint(got, lookalikes))


# -- RoPETransformerBlock (optional) -------------------------------------------------------------

# (id, B, T, D, H, theta)
ROPE_CASES = [
    ("B2-T6-D8-H2", 2, 6, 8, 2, 10000.0),
    ("B1-T9-D24-H3-theta500", 1, 9, 24, 3, 500.0),
    ("B3-T4-D16-H2", 3, 4, 16, 2, 10000.0),
]


def _rope_recipe(state, d_model, num_heads, theta, **options) -> ModuleCall:
    return ModuleCall(init_kwargs={"d_model": d_model, "num_heads": num_heads, "theta": theta}, state=state,
                      **options)


@exercise("RoPETransformerBlock")
@pytest.mark.parametrize("case", ROPE_CASES, ids=case_ids(ROPE_CASES))
def test_rope_block_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference loaded with the same weights"""
    _, batch, length, d_model, num_heads, theta = case
    x = inputs.randn(batch, length, d_model)
    recipe = _rope_recipe(_block_state(inputs, d_model), d_model, num_heads, theta)
    expect_module_matches_reference(submission, reference, bugs, "RoPETransformerBlock", recipe, x)


@exercise("RoPETransformerBlock")
@pytest.mark.parametrize("case", ROPE_CASES[:2], ids=case_ids(ROPE_CASES[:2]))
def test_rope_block_matches_pytorch(submission, bugs, inputs, case):
    """equals the block with queries and keys rotated as Meta's llama does (complex numbers), then F.scaled_dot_product_attention(is_causal=True)"""
    _, batch, length, d_model, num_heads, theta = case
    x = inputs.randn(batch, length, d_model)
    state = _block_state(inputs, d_model)
    recipe = _rope_recipe(state, d_model, num_heads, theta)
    got, call = run_module(submission, "RoPETransformerBlock", recipe, x)
    expect_close(got, oracles.rope_block(state, num_heads, theta, x), call,
                 lookalikes=bugs.module("RoPETransformerBlock", recipe, x),
                 reference="queries and keys rotated as complex numbers (Meta's llama), "
                           "F.scaled_dot_product_attention(is_causal=True)")


# (id, B, T_past, T, D, H, theta): T_past 0 is a call without a cache
ROPE_CACHE_CASES = [
    ("B2-past0-T4-D8-H2-no-cache", 2, 0, 4, 8, 2, 10000.0),
    ("B1-past6-T1-D12-H3-one-token", 1, 6, 1, 12, 3, 10000.0),
    ("B2-past3-T3-D16-H2-theta500-a-chunk", 2, 3, 3, 16, 2, 500.0),
]


@exercise("RoPETransformerBlock")
@pytest.mark.parametrize("case", ROPE_CACHE_CASES, ids=case_ids(ROPE_CACHE_CASES))
def test_rope_block_with_cache_rotates_from_the_past_length(submission, bugs, inputs, case):
    """forward_with_cache(x, cache) rotates the new tokens at positions T_past.., gives the whole sequence's last rows, and appends the rotated keys"""
    _, batch, past, length, d_model, num_heads, theta = case
    x = inputs.randn(batch, past + length, d_model)  # (B, T_past + T, D): the whole sequence
    state = _block_state(inputs, d_model)
    keys, values = oracles.rope_block_keys_values(state, num_heads, theta, x)  # (B, H, T_past + T, d) each
    recipe = _rope_recipe(state, d_model, num_heads, theta, method="forward_with_cache")
    args = (x[:, past:],) if past == 0 else (x[:, past:], (keys[:, :, :past], values[:, :, :past]))
    got, call = run_module(submission, "RoPETransformerBlock", recipe, *args)
    lookalikes = bugs.module("RoPETransformerBlock", recipe, *args)
    output, cache = unpack(got, ("output", "cache"), call)
    expect_close(output, oracles.rope_block(state, num_heads, theta, x)[:, past:], f"output of {call}",
                 lookalikes=_parts(lookalikes, 0),
                 reference=f"the last {length} rows of the RoPE block on all {past + length} positions "
                           f"(rotated as Meta's llama does, F.scaled_dot_product_attention(is_causal=True))")
    _expect_cache(cache, (keys, values), f"the cache {call} returned", lookalikes, (1,))


@exercise("RoPETransformerBlock")
def test_rope_block_is_causal(submission, inputs):
    """changing the last token's input changes no earlier position's output"""
    x = inputs.randn(2, 6, 8)
    changed = x.clone()
    changed[:, -1] = inputs.randn(2, 8)
    recipe = _rope_recipe(_block_state(inputs, 8), 8, 2, 10000.0)
    _expect_causal(submission, "RoPETransformerBlock", recipe, x, changed, "input")


@exercise("RoPETransformerBlock")
def test_rope_block_parameters(submission, inputs):
    """has TransformerBlock's parameters and no other (RoPE has none)"""
    recipe = ModuleCall(init_kwargs={"d_model": 8, "num_heads": 2}, return_state=True)
    expected = {key: tuple(value.shape) for key, value in _block_state(inputs, 8).items()}
    _expect_parameters(submission, "RoPETransformerBlock", recipe, inputs.randn(2, 3, 8), expected)


# -- sample_next_token (optional) ----------------------------------------------------------------

# A sampler is judged by what it draws, not by one draw: each call draws DRAWS tokens, half
# from each of two rows of logits, and each token's share of a row's draws must be within
# SIGMAS standard deviations of its probability under the filters (oracles.py, as Hugging
# Face's warpers compute it), and never drawn where the filters removed it. Six draws in
# 10,000 more are allowed for the rare tokens, whose counts are far from normal: by the exact
# binomial tails a correct sampler strays past a bound with a chance under 1e-9 a token, and
# fails one grade of the five cases in about 25 million (3.96e-8). Every known bug moves some
# token's share by 0.22 or more in some case, against 0.03 allowed (10,000 draws, a share near
# one half).
DRAWS = 20000
SIGMAS = 6.0
LOGITS = (3.0, 2.2, 1.5, 1.0, 0.4, 0.0, -0.7, -1.5)  # V = 8, no two near a filter's edge
# (id, temperature, top_k, top_p): each filter alone, then all three, whose order matters.
# With V = 8, two misreadings often keep the same tokens on one row, and so draw the very
# same tokens: at T = 1, a top-p ranked from the least likely up keeps every token, as no
# top-p at all does; top-k of the smallest (largest=False) at k = 5 keeps the k - 1 largest.
# These cases were searched for (T, k, p) where no known bug, no two of them together and no
# mistake of tests/mistakes/ch08.py keep the same tokens as another of them.
SAMPLING_CASES = [
    ("T1", 1.0, None, None),
    ("T0.6", 0.6, None, None),
    ("T2-k3", 2.0, 3, None),
    ("T2-p0.6", 2.0, None, 0.6),
    ("T2.5-k7-p0.7", 2.5, 7, 0.7),
]
SAMPLING_HINTS = {bug.name: bug.hint for bug in BUGS if bug.exercise == "sample_next_token"}


def _sampling_logits(inputs) -> torch.Tensor:
    """``(DRAWS, V)``: two rows of logits, each repeated, shuffled differently (row ``i``
    is one of them by ``i % 2``); the second is also sharper and shifted."""
    base = torch.tensor(LOGITS)
    rows = torch.stack([base[inputs.permutation(len(LOGITS))], 1.3 * base[inputs.permutation(len(LOGITS))] - 0.5])
    return rows.repeat(DRAWS // 2, 1)  # (DRAWS, V)


def _sampling_seed(inputs) -> int:
    """A seed of the check's own, drawn from its inputs: the same on every run of the check."""
    return int(torch.randint(2**31 - 1, (), generator=inputs.generator))


def _shares(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``(2, V)`` float64: how often each token was drawn from each of the two rows."""
    return torch.stack([torch.bincount(tokens[row::2], minlength=vocab_size)[:vocab_size].double() / (DRAWS // 2)
                        for row in range(2)])


def _allowed(probabilities: torch.Tensor) -> torch.Tensor:
    """``(2, V)``: how far a token's share of ``DRAWS // 2`` draws may stray from its probability."""
    draws = DRAWS // 2
    return SIGMAS * (probabilities * (1 - probabilities) / draws).sqrt() + 6 / draws


def _follows(shares: torch.Tensor, probabilities: torch.Tensor) -> bool:
    """Do the draws' shares follow ``probabilities``, within chance?"""
    removed_drawn = (probabilities == 0) & (shares > 0)
    return not bool(removed_drawn.any()) and bool(((shares - probabilities).abs() <= _allowed(probabilities)).all())


def _misreadings(logits, temperature, top_k, top_p, right) -> list[tuple[str, torch.Tensor]]:
    """``(known bug, (2, V) distribution)`` for each misreading of the filters this case can
    tell from ``right``, the right one. Asked on every run, failed or not: the student
    edition answers only the oracle calls that grading the reference made."""
    rows = logits[:2]
    asked = [("temperature-multiplied", (rows, 1 / temperature, top_k, top_p), {}),
             ("greedy", (rows, 1.0, 1, None), {})]
    if top_k is not None and top_k > 1:
        asked.append(("top-k-keeps-one-too-few", (rows, temperature, top_k - 1, top_p), {}))
    if top_p is not None:
        asked.append(("top-p-drops-the-crossing-token", (rows, temperature, top_k, top_p), {"crossing_kept": False}))
    found = [(name, oracles.sampling_distribution(*args, **kwargs)) for name, args, kwargs in asked]
    return [(name, wrong) for name, wrong in found if not _follows(wrong, right)]


def _sampling_misreading(shares, misreadings) -> str | None:
    """The hint of the known bug whose distribution the draws follow instead, judged from
    the shares alone: a sampler written otherwise than the reference draws other tokens
    than the bug made in the reference, from the same distribution."""
    return next((SAMPLING_HINTS[name] for name, wrong in misreadings if _follows(shares, wrong)), None)


def _drawn(got, call: str, vocab_size: int, hint: str | None = None) -> torch.Tensor:
    if (not isinstance(got, torch.Tensor) or tuple(got.shape) != (DRAWS,) or got.dtype != torch.int64):
        fail(f"{call} returned {describe(got)}; expected ({DRAWS},) int64: one token a row", hint=hint)
    outside = (got < 0) | (got >= vocab_size)
    if bool(outside.any()):
        fail(f"{call} drew token {int(got[outside][0])}, outside the vocabulary 0 .. {vocab_size - 1}", hint=hint)
    return got


@exercise("sample_next_token")
@pytest.mark.parametrize("case", SAMPLING_CASES, ids=case_ids(SAMPLING_CASES))
def test_sampling_draws_from_the_filtered_softmax(submission, bugs, inputs, case):
    """draws each token as often as its probability after temperature, top-k and top-p, in that order, and never one they remove"""
    _, temperature, top_k, top_p = case
    logits, seed = _sampling_logits(inputs), _sampling_seed(inputs)
    got, call = run(submission, "sample_next_token", logits, temperature, top_k, top_p, seed=seed)
    lookalikes = bugs.sample_next_token(logits, temperature, top_k, top_p, seed=seed)
    tokens = _drawn(got, call, len(LOGITS), matching_hint(got, lookalikes))
    shares = _shares(tokens, len(LOGITS))
    expected = oracles.sampling_distribution(logits[:2], temperature, top_k, top_p)  # (2, V)
    misreadings = _misreadings(logits, temperature, top_k, top_p, expected)
    if _follows(shares, expected):
        return
    hint = matching_hint(got, lookalikes) or _sampling_misreading(shares, misreadings)
    off = (shares - expected).abs() - _allowed(expected)  # (2, V)
    off = off.masked_fill((expected == 0) & (shares > 0), float("inf"))
    row, token = divmod(int(off.argmax()), len(LOGITS))
    if expected[row, token] == 0:
        fail(f"{call} drew token {token} from row {row} of the logits {shares[row, token]:.1%} of the time, but the "
             f"filters remove it there: its probability is 0", hint=hint)
    fail(f"{call} drew token {token} from row {row} of the logits {shares[row, token]:.1%} of the time, of "
         f"{DRAWS // 2} draws; its probability is {expected[row, token]:.1%} (more than {SIGMAS:g} standard "
         f"deviations away: not chance)", hint=hint)


@exercise("sample_next_token")
def test_sampling_repeats_with_its_seed_and_only_with_it(submission, bugs, inputs):
    """the same seed draws the same tokens, and another seed other tokens"""
    logits, seed = _sampling_logits(inputs), _sampling_seed(inputs)
    first, call = run(submission, "sample_next_token", logits, 1.0, None, None, seed=seed)
    again, _ = run(submission, "sample_next_token", logits, 1.0, None, None, seed=seed)
    other, other_call = run(submission, "sample_next_token", logits, 1.0, None, None, seed=seed + 1)
    lookalikes = bugs.sample_next_token(logits, 1.0, None, None, seed=seed + 1)
    first, again = _drawn(first, call, len(LOGITS)), _drawn(again, call, len(LOGITS))
    other = _drawn(other, other_call, len(LOGITS), matching_hint(other, lookalikes))
    expect_true(torch.equal(first, again), f"{call} drew other tokens when called again: the draw must come from "
                                           f"a generator seeded with seed, torch.Generator(logits.device).manual_seed(seed)")
    if torch.equal(first, other):
        fail(f"{other_call} drew the very tokens the seed {seed} drew: the draw must depend on the seed",
             hint=matching_hint(other, lookalikes))


# -- every exercise -----------------------------------------------------------------------

test_would_run_on_a_gpu = portability_check([
    portable("TransformerBlock", lambda inputs: (
        (inputs.randn(2, 5, 8),), {"module": ModuleCall(init_kwargs={"d_model": 8, "num_heads": 2})})),
    portable("TinyLM", lambda inputs: (
        (torch.randint(11, (2, 5), generator=inputs.generator),),
        {"module": ModuleCall(init_kwargs={"vocab_size": 11, "d_model": 8, "num_heads": 2, "num_layers": 1,
                                           "context": 8})})),
    portable("train", lambda inputs: ((_text_tokens()[0][:200], _text_tokens()[1], 2), {})),
    # The cached paths make their masks and positions too; generate its tokens.
    pytest.param("TransformerBlock", lambda inputs: (
        (inputs.randn(2, 1, 8), (inputs.randn(2, 2, 3, 4), inputs.randn(2, 2, 3, 4))),
        {"module": ModuleCall(init_kwargs={"d_model": 8, "num_heads": 2}, method="forward_with_cache")}),
        marks=exercise("TransformerBlock"), id="TransformerBlock.forward_with_cache"),
    pytest.param("TinyLM", lambda inputs: (
        (torch.randint(11, (2, 1), generator=inputs.generator), [(inputs.randn(2, 2, 3, 4), inputs.randn(2, 2, 3, 4))]),
        {"module": ModuleCall(init_kwargs={"vocab_size": 11, "d_model": 8, "num_heads": 2, "num_layers": 1,
                                           "context": 8}, method="forward_with_cache")}),
        marks=exercise("TinyLM"), id="TinyLM.forward_with_cache"),
    pytest.param("TinyLM", lambda inputs: (
        (torch.randint(11, (2, 3), generator=inputs.generator), 4),
        {"module": ModuleCall(init_kwargs={"vocab_size": 11, "d_model": 8, "num_heads": 2, "num_layers": 1,
                                           "context": 8}, passed_to="generate")}),
        marks=exercise("generate"), id="generate"),
    pytest.param("RoPETransformerBlock", lambda inputs: (
        (inputs.randn(2, 1, 8), (inputs.randn(2, 2, 3, 4), inputs.randn(2, 2, 3, 4))),
        {"module": ModuleCall(init_kwargs={"d_model": 8, "num_heads": 2}, method="forward_with_cache")}),
        marks=exercise("RoPETransformerBlock"), id="RoPETransformerBlock.forward_with_cache"),
])
