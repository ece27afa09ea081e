"""Chapter 8 (a tiny causal language model): the reference scores full marks and the stub
zero; a correct block written otherwise (PyTorch's causal attention) passes; a block
without the causal mask fails its causality check and makes train's loss too low, with a
message that says why; unshifted targets fail the training check alone; a model copied
before training is caught when train returns it; the KV cache's slips (is_causal=True with
a cache, positions restarting at 0, a cache not carried from step to step) are caught where
they are made, with their hints; a generate that recomputes instead is right; an argmax tie
may go either way; and the lesson's numbers (the alphabet of text.txt, ln V, the loss the
reference reaches) are true."""

import importlib.util
import math
import subprocess
import sys
import time

import pytest
import torch

from conftest import TRAINING, Draw, replace_function, result_of, solution_source, statuses, stub_source
from grader.chapters.ch08.bugs import BUGS
from grader.chapters.ch08.test_ch08_tiny_language_model import (LEARNED, SEES_THE_ANSWER, TRAIN_SETTINGS, TRAIN_STEPS,
                                                             _text_tokens)
from grader.catalog import COURSE_ROOT, find_chapter
from grader.known_bugs import apply_bug, function_span

CH08 = find_chapter("ch08")
SOLUTION = solution_source(CH08)
LESSON = COURSE_ROOT / "chapters" / CH08.folder
CAUSAL_CHECK = "changing the last token's input changes no earlier position's output"


def _bug(name: str):
    return next(bug for bug in BUGS if bug.name == name)


def _failed(report, exercise: str) -> dict[str, str]:
    """``{check title: message}`` of the exercise's failed checks."""
    return {check.check: check.message for check in result_of(report, exercise).failed_checks}


def test_solution_scores_full_marks_and_stub_scores_zero(grade_source):
    solved = grade_source(SOLUTION, chapter="ch08", limits=TRAINING)
    assert solved.passed and solved.score == solved.max_score == 15
    stub = grade_source(stub_source(CH08), chapter="ch08")
    assert stub.score == 0 and not stub.passed
    assert statuses(stub) == {"TransformerBlock": "not implemented", "TinyLM": "not implemented",
                              "train": "not implemented", "generate": "not implemented",
                              "RoPETransformerBlock": "not attempted", "sample_next_token": "not attempted"}


# Correct code written otherwise: PyTorch's causal attention, the heads split with
# unflatten, the MLP's layers named through an nn.Sequential built from a list; with a
# cache, the bottom-right mask passed to SDPA (its is_causal=True is top-left).
OTHER_STYLE_BLOCK = '''
class TransformerBlock(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(*[nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)])

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (self.h, -1)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))

    def forward_with_cache(self, x, cache=None):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (self.h, -1)).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        length, keys = q.shape[2], k.shape[2]
        ATTEND
        y = F.scaled_dot_product_attention(q, k, v, MASK).transpose(1, 2).flatten(2)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x)), (k, v)
'''
BOTTOM_RIGHT = "attend = torch.ones(length, keys, dtype=torch.bool, device=x.device).tril(keys - length)"


def test_correct_code_in_another_style_scores_full_marks(grade_source):
    block = OTHER_STYLE_BLOCK.replace("ATTEND", BOTTOM_RIGHT).replace("MASK", "attn_mask=attend")
    report = grade_source(replace_function(SOLUTION, "TransformerBlock", block), chapter="ch08", limits=TRAINING)
    assert report.passed, [(r.exercise.name, r.reason) for r in report.exercises if r.status != "passed"]


def test_is_causal_with_a_cache_is_told_its_mask_is_the_top_left_corner(grade_source):
    """SDPA's is_causal=True aligns its mask top-left: right without a cache, wrong with one
    (a new token would see only the first keys)."""
    block = OTHER_STYLE_BLOCK.replace("ATTEND", "pass").replace("MASK", "is_causal=True")
    report = grade_source(replace_function(SOLUTION, "TransformerBlock", block), chapter="ch08",
                          only={"TransformerBlock"})
    assert statuses(report)["TransformerBlock"] == "failed"
    failed = result_of(report, "TransformerBlock").failed_checks
    assert failed and all(check.check.startswith("forward_with_cache(x, cache)") for check in failed)
    assert failed[0].hint == _bug("top-left-mask").hint


def test_positions_that_restart_at_0_fail_the_models_cached_path_and_generate(grade_source):
    report = grade_source(apply_bug(SOLUTION, _bug("positions-restart-at-0")), chapter="ch08", limits=TRAINING)
    assert statuses(report) == {"TransformerBlock": "passed", "TinyLM": "failed", "train": "passed",
                                "generate": "failed", "RoPETransformerBlock": "passed",
                                "sample_next_token": "passed"}
    model = result_of(report, "TinyLM")
    assert {check.hint for check in model.failed_checks} >= {_bug("positions-restart-at-0").hint}
    assert "TinyLM" in result_of(report, "generate").note  # "it uses TinyLM, which fails too"


def test_a_cache_not_carried_fails_generate_alone_with_its_hint(grade_source):
    report = grade_source(apply_bug(SOLUTION, _bug("cache-not-carried")), chapter="ch08", limits=TRAINING)
    assert statuses(report)["TinyLM"] == "passed" and statuses(report)["generate"] == "failed"
    failed = result_of(report, "generate").failed_checks
    assert failed and all(check.hint == _bug("cache-not-carried").hint for check in failed
                          if check.check.startswith(("gives the tokens", "each new token")))
    own = [message for check, message in _failed(report, "generate").items()
           if check.startswith("each new token's logits are your TinyLM's")]
    assert own and all("cached and recomputed must agree" in message for message in own)


# Greedy generation without the cache: the whole sequence again at every step. Slow, and right.
RECOMPUTING_GENERATE = '''
def generate(model, prompt, num_tokens):
    tokens, chosen = prompt, []
    with torch.no_grad():
        for _ in range(num_tokens):
            last = model(tokens)[:, -1]
            chosen.append(last)
            tokens = torch.cat([tokens, last.argmax(-1, keepdim=True)], dim=1)
    return tokens, torch.stack(chosen, dim=1)
'''


# The prompt fed one token at a time through the cache, as some decoders do: slower, and right.
PROMPT_A_TOKEN_AT_A_TIME = '''
def generate(model, prompt, num_tokens):
    cache, chosen = None, []
    with torch.no_grad():
        for position in range(prompt.shape[1]):
            logits, cache = model.forward_with_cache(prompt[:, position:position + 1], cache)
        tokens = prompt
        for _ in range(num_tokens):
            chosen.append(logits[:, -1])
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            logits, cache = model.forward_with_cache(tokens[:, -1:], cache)
    return tokens, torch.stack(chosen, dim=1)
'''


@pytest.mark.parametrize("definition", [RECOMPUTING_GENERATE, PROMPT_A_TOKEN_AT_A_TIME],
                         ids=["recomputing", "prompt-a-token-at-a-time"])
def test_generate_written_otherwise_is_right(grade_source, definition):
    """generate is judged by what it returns; TinyLM's checks judge the cached path."""
    report = grade_source(replace_function(SOLUTION, "generate", definition), chapter="ch08", only={"generate"})
    assert statuses(report)["generate"] == "passed", result_of(report, "generate").reason


# -- the optional RoPE block ---------------------------------------------------------------

def _without_rope_block(source: str) -> str:
    start, _ = function_span(source, "RoPETransformerBlock")
    return source[:start]  # the class is the file's last definition


def test_the_optional_block_left_out_or_as_the_stub_costs_nothing(grade_source):
    """Not written (the stub's body) or not there at all (a file from before it existed):
    "not attempted", full marks, and the grade passes."""
    stub_block = stub_source(CH08)[function_span(stub_source(CH08), "RoPETransformerBlock")[0]:]
    for source in (_without_rope_block(SOLUTION), _without_rope_block(SOLUTION) + stub_block):
        report = grade_source(source, chapter="ch08", limits=TRAINING)
        assert statuses(report)["RoPETransformerBlock"] == "not attempted"
        assert report.passed and report.score == report.max_score == 15
        assert result_of(report, "RoPETransformerBlock").score == 0


@pytest.mark.parametrize("name", ["rope-positions-from-0", "cached-keys-rotated-again", "values-rotated",
                                  "rope-half-pairs", "theta-ignored"])
def test_a_wrong_optional_block_fails_the_grade_with_its_hint_and_costs_no_points(grade_source, name):
    report = grade_source(apply_bug(SOLUTION, _bug(name)), chapter="ch08", limits=TRAINING,
                          only={"RoPETransformerBlock"})
    assert statuses(report) == {"RoPETransformerBlock": "failed"} and not report.passed
    hints = {check.hint for check in result_of(report, "RoPETransformerBlock").failed_checks}
    assert _bug(name).hint in hints


# Meta's llama: pairs as complex numbers turned by e^(i p theta^(-2k/d)); PyTorch's attention with
# the bottom-right mask as a boolean "attend" mask; the cache holds the rotated keys.
COMPLEX_ROPE_BLOCK = '''
class RoPETransformerBlock(TransformerBlock):
    def __init__(self, d_model, num_heads, theta=10000.0):
        super().__init__(d_model, num_heads)
        self.theta = theta

    def forward(self, x):
        return self.forward_with_cache(x)[0]

    def forward_with_cache(self, x, cache=None):
        B, T, D = x.shape
        H = self.num_heads
        q, k, v = self.qkv(self.ln1(x)).unflatten(-1, (3, H, D // H)).permute(2, 0, 3, 1, 4)
        past = 0 if cache is None else cache[0].size(2)
        freqs = 1.0 / (self.theta ** (torch.arange(0, D // H, 2, device=x.device).float() / (D // H)))
        t = torch.arange(past, past + T, device=x.device).float()
        freqs_cis = torch.polar(torch.ones(T, D // H // 2, device=x.device), torch.outer(t, freqs))

        def turn(u):
            u_ = torch.view_as_complex(u.float().reshape(*u.shape[:-1], -1, 2))
            return torch.view_as_real(u_ * freqs_cis).flatten(3).type_as(u)

        q, k = turn(q), turn(k)
        if cache is not None:
            k, v = torch.cat((cache[0], k), 2), torch.cat((cache[1], v), 2)
        attend = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attend)
        x = x + self.proj(y.transpose(1, 2).flatten(2))
        return x + self.mlp(self.ln2(x)), (k, v)
'''


def test_the_optional_block_in_llamas_style_passes(grade_source):
    report = grade_source(replace_function(SOLUTION, "RoPETransformerBlock", COMPLEX_ROPE_BLOCK), chapter="ch08",
                          only={"RoPETransformerBlock"})
    assert statuses(report) == {"RoPETransformerBlock": "passed"}, result_of(report, "RoPETransformerBlock").reason


def test_an_argmax_tie_may_go_either_way():
    from grader.chapters.ch08.test_ch08_tiny_language_model import _off_the_top

    logits = torch.tensor([[1.0, 3.0, 3.0 - 1e-6, -2.0], [0.5, 0.0, 0.25, 0.5]])  # (B, V)
    assert _off_the_top(logits, torch.tensor([1, 0])).tolist() == [False, False]
    assert _off_the_top(logits, torch.tensor([2, 3])).tolist() == [False, False]  # ties
    assert _off_the_top(logits, torch.tensor([0, 2])).tolist() == [True, True]
    assert _off_the_top(logits, torch.tensor([4, -1])).tolist() == [True, True]  # not a token


def test_a_block_without_the_causal_mask_is_caught_and_its_training_loss_is_too_low(grade_source):
    report = grade_source(apply_bug(SOLUTION, _bug("no-causal-mask")), chapter="ch08", limits=TRAINING)
    block = _failed(report, "TransformerBlock")
    assert "is the causal mask missing" in block[CAUSAL_CHECK]
    (training,) = _failed(report, "train").values()
    assert "is too low: the model sees the token it must predict" in training
    assert "is the causal mask missing" in training.lower() and "step 0: " in training


def test_a_model_whose_earlier_outputs_hold_nan_is_told_so(grade_source):
    # The future mask inverted: the last position sees no key and gets NaN, which
    # the second block spreads to every position. The causality check names the
    # NaN instead of "changed the outputs at earlier positions (by up to nan)".
    inverted = SOLUTION.replace('scores.masked_fill(future, float("-inf"))', 'scores.masked_fill(~future, float("-inf"))')
    assert inverted != SOLUTION
    report = grade_source(inverted, chapter="ch08", limits=TRAINING, only={"TinyLM"})
    message = _failed(report, "TinyLM")["changing the last token changes no earlier position's logits"]
    assert "NaN at [" in message and "every key of that query masked" in message, message
    assert "by up to nan" not in message


def test_unshifted_targets_fail_the_training_check_alone(grade_source):
    report = grade_source(apply_bug(SOLUTION, _bug("targets-not-shifted")), chapter="ch08", limits=TRAINING)
    assert statuses(report)["TransformerBlock"] == statuses(report)["TinyLM"] == "passed"
    (message,) = _failed(report, "train").values()
    assert "too low" in message and "targets not the inputs shifted by one" in message


def test_a_model_that_does_not_learn_shows_its_loss_curve(grade_source):
    report = grade_source(apply_bug(SOLUTION, _bug("no-optimizer-step")), chapter="ch08", limits=TRAINING)
    (message,) = _failed(report, "train").values()
    assert f"above {LEARNED}" in message
    assert "step 0: " in message and f"step {TRAIN_STEPS - 1}: " in message
    (check,) = result_of(report, "train").failed_checks
    assert check.hint == _bug("no-optimizer-step").hint


def test_a_softmax_before_the_cross_entropy_is_not_told_it_takes_no_step(grade_source):
    """Its curve is as flat as no step's, but it stays within the bounds of a
    cross-entropy of probabilities, which no step's untrained model leaves."""
    source = SOLUTION.replace("F.cross_entropy(logits.reshape(-1, vocab_size)",
                              "F.cross_entropy(torch.softmax(logits, dim=-1).reshape(-1, vocab_size)")
    report = grade_source(source, chapter="ch08", limits=TRAINING, only={"train"})
    (check,) = [check for check in result_of(report, "train").failed_checks if "below 3.1" in check.check]
    assert check.relation == "probabilities" and "softmax applied before F.cross_entropy" in check.hint


def test_a_model_copied_before_training_fails_the_returned_model_check_alone(grade_source):
    source = SOLUTION.replace("    optimizer = torch.optim.AdamW",
                              "    untrained = copy.deepcopy(model)\n    optimizer = torch.optim.AdamW")
    source = "import copy\n" + source.replace("return model, losses", "return untrained, losses")
    report = grade_source(source, chapter="ch08", limits=TRAINING)
    (message,) = _failed(report, "train").values()
    assert "as an untrained one has" in message and "return the model the loop trained" in message
    assert result_of(report, "train").failed_checks[0].hint == _bug("fresh-model-returned").hint


def test_returning_only_the_losses_is_told_what_train_returns(grade_source):
    report = grade_source(SOLUTION.replace("return model, losses", "return losses"), chapter="ch08",
                          limits=TRAINING)
    messages = _failed(report, "train").values()
    assert messages and all("expected a tuple (model, losses)" in message for message in messages)

def _reference():
    spec = importlib.util.spec_from_file_location("reference_ch08_for_tests",
                                                  CH08.solution())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_what_the_chapter_preloads_is_what_training_imports_on_its_own():
    """A batch imports CH08.preload once, before it forks: each name must be a module the
    reference's train would import anyway, or the batch pays for nothing."""
    script = (
        "import importlib.util, sys, torch\n"
        f"spec = importlib.util.spec_from_file_location('reference', {str(COURSE_ROOT / 'solutions' / (CH08.module + '.py'))!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        f"before = {{name: name in sys.modules for name in {CH08.preload!r}}}\n"
        "module.train(torch.arange(100) % 7, 7, 2, context=8, batch_size=2)\n"
        f"print([not before[name] and name in sys.modules for name in {CH08.preload!r}])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert CH08.preload and done.stdout.strip() == str([True] * len(CH08.preload)), done.stderr

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_reference_learns_with_margin_on_both_sides_and_fast(seed):
    tokens, vocab_size = _text_tokens()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the worker
    try:
        start = time.process_time()  # CPU time: a loaded machine stretches the clock's
        _, losses = _reference().train(tokens, vocab_size, TRAIN_STEPS, seed=seed, **TRAIN_SETTINGS)
        seconds = time.process_time() - start
    finally:
        torch.set_num_threads(threads)
    final = sum(losses[-10:]) / 10
    assert SEES_THE_ANSWER + 0.6 < final < LEARNED - 0.3
    assert abs(losses[0] - math.log(vocab_size)) < 0.5
    assert seconds < 2


def test_the_lessons_numbers_are_the_texts():
    _, vocab_size = _text_tokens()
    lesson = (LESSON / "README.md").read_text(encoding="utf-8")
    assert vocab_size == 32 and f"$\\ln {vocab_size} = {math.log(vocab_size):.2f}$" in lesson
    assert f"below {LEARNED}" in lesson and f"not below {SEES_THE_ANSWER}" in lesson
    assert f"{TRAIN_STEPS} steps" in lesson



# Section 6's worked example of sampling: the filters, and the probabilities the lesson prints.
SAMPLING_EXAMPLE = [
    ("none ($T = 1$)", {}, "0.563, 0.207, 0.126, 0.076, 0.028"),
    ("$T = 0.5$", {"temperature": 0.5}, "0.829, 0.112, 0.041, 0.015, 0.002"),
    ("$T = 2$", {"temperature": 2.0}, "0.375, 0.227, 0.177, 0.138, 0.084"),
    ("top-k, $k = 3$", {"top_k": 3}, "0.629, 0.231, 0.140, 0, 0"),
    ("top-p, $p = 0.8$", {"top_p": 0.8}, "0.629, 0.231, 0.140, 0, 0"),
    ("top-k $k = 3$, then top-p $p = 0.8$", {"top_k": 3, "top_p": 0.8}, "0.731, 0.269, 0, 0, 0"),
]


@pytest.mark.parametrize("row, options, printed", SAMPLING_EXAMPLE, ids=[row for row, _, _ in SAMPLING_EXAMPLE])
def test_the_lessons_sampling_example_is_what_the_reference_draws(row, options, printed):
    """The lesson's table is the oracle's distribution rounded, and the reference's draws
    (200,000 of the example row) follow it to within 0.005."""
    from grader.chapters.ch08.oracles import sampling_distribution

    lesson = (LESSON / "README.md").read_text(encoding="utf-8")
    assert f"| {row} | {printed} |" in lesson
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]], dtype=torch.float64)
    exact = sampling_distribution(logits, options.get("temperature", 1.0), options.get("top_k"),
                                  options.get("top_p"))[0]
    assert ", ".join("0" if p == 0 else f"{p:.3f}" for p in exact.tolist()) == printed
    drawn = _reference().sample_next_token(logits.repeat(200_000, 1), **options, seed=0)
    shares = torch.bincount(drawn, minlength=5).double() / len(drawn)
    assert (shares - exact).abs().max() < 0.005 and bool((shares[exact == 0] == 0).all())


@pytest.mark.parametrize("old, new, bug", [
    ("scores = logits / temperature", "scores = logits * temperature", "temperature-multiplied"),
    ("cumulative_probs <= (1 - top_p)", "cumulative_probs < (1 - top_p) + sorted_logits.softmax(dim=-1)",
     "top-p-drops-the-crossing-token"),
    ("torch.topk(scores, top_k)[0][..., -1, None]", "torch.topk(scores, top_k - 1)[0][..., -1, None]",
     "top-k-keeps-one-too-few"),
])
def test_a_sampler_written_otherwise_is_named_by_the_distribution_it_draws_from(grade_source, old, new, bug):
    """Hugging Face's warpers with a known bug's misreading draw other tokens than the bug
    made in the reference; the checks still name it, from the draws' shares."""
    source = (COURSE_ROOT / "tests" / "correct_styles" / "ch08_hf.py").read_text(encoding="utf-8")
    assert source.count(old) == 1
    report = grade_source(source.replace(old, new), chapter="ch08", only={"sample_next_token"})
    hints = {check.hint for check in result_of(report, "sample_next_token").failed_checks}
    assert hints == {_bug(bug).hint}

# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py); a class's args
    are ``(init args, call args, call kwargs)``."""
    tokens = torch.randint(0, 20, (2, 8), generator=draw.generator)
    cache = (draw.randn(2, 2, 3, 8), draw.randn(2, 2, 3, 8))  # (B, H, T_past, d) keys and values
    caches = [(draw.randn(2, 2, 5, 8), draw.randn(2, 2, 5, 8)) for _ in range(2)]  # one a block
    cached = {"method": "forward_with_cache"}
    return [
        ("TransformerBlock", ((16, 2), (draw.randn(2, 5, 16),), {}), {}),
        ("TransformerBlock", ((16, 2), (draw.randn(2, 4, 16),), {}), cached),
        ("TransformerBlock", ((16, 2), (draw.randn(2, 1, 16), cache), {}), cached),
        ("TransformerBlock", ((16, 2), (draw.randn(2, 2, 16), cache), {}), cached),
        ("TinyLM", ((20, 16, 2, 2, 8), (tokens,), {}), {}),
        ("TinyLM", ((20, 16, 2, 2, 8), (tokens[:, :5],), {}), cached),
        ("TinyLM", ((20, 16, 2, 2, 8), (tokens[:, 5:], caches), {}), cached),
        ("TinyLM", ((20, 16, 2, 2, 8), (tokens[:, :2], 5), {}), {"passed_to": "generate"}),
        ("TinyLM", ((20, 16, 2, 1, 8), (tokens[:1, :1], 7), {}), {"passed_to": "generate"}),
        ("RoPETransformerBlock", ((16, 2), (draw.randn(2, 5, 16),), {}), {}),
        ("RoPETransformerBlock", ((16, 2, 500.0), (draw.randn(2, 4, 16),), {}), cached),
        ("RoPETransformerBlock", ((16, 2), (draw.randn(2, 2, 16), cache), {}), cached),
    ]


# The known bug tests/test_release.py makes in the edition and in this tree.
RELEASE_BUG = ("TransformerBlock", "no-causal-mask")

# train trains on the course's text with random draws of its own: its checks take nothing
# from the seed (tests/test_correct_styles.py grades the corpus on it once, not on five
# seeds), and no sample call compares its losses with the reference's (grading alone does).
# Nor does one of sample_next_token's draws: two right samplers draw other tokens from one
# seed, and its checks judge the draws as a distribution.
SEED_FREE = ("train",)
UNSAMPLED = ("train", "sample_next_token")
