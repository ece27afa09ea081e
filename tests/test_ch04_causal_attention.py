"""Chapter 4's checks: full marks for correct code, zero for the stubs, and
pitfalls of causal attention and the KV cache caught with words a student can
act on. (Each known bug of grader/chapters/ch04/bugs.py is proved caught by
test_known_bugs.py; the wrong versions here are written differently.)"""

import torch

from conftest import Draw, replace_function, result_of, solution_source, statuses, stub_source
from grader.catalog import find_chapter

CH04 = find_chapter("ch04")
SOLUTION = solution_source(CH04)

# Correct, but written another way than the reference: masks from index
# comparisons, projections with F.linear, heads with permute, attention by
# F.scaled_dot_product_attention with an explicit (bottom-right) mask.
ALTERNATIVE = '''
import torch
import torch.nn.functional as F


def causal_mask(num_queries, num_keys=None, device=None):
    num_keys = num_queries if num_keys is None else num_keys
    queries = torch.arange(num_queries, device=device)[:, None]
    keys = torch.arange(num_keys, device=device)[None, :]
    return keys <= queries + (num_keys - num_queries)


def _split(t, num_heads):
    batch, length, _ = t.shape
    return t.reshape(batch, length, num_heads, -1).permute(0, 2, 1, 3)


def _merge(t):
    batch, _, length, _ = t.shape
    return t.permute(0, 2, 1, 3).reshape(batch, length, -1)


def causal_self_attention(x, num_heads, w_q, w_k, w_v, w_o, lengths=None):
    length = x.shape[1]
    q, k, v = (_split(F.linear(x, w), num_heads) for w in (w_q, w_k, w_v))
    mask = causal_mask(length, device=x.device)
    if lengths is not None:
        mask = mask & (torch.arange(length, device=x.device) < lengths[:, None])[:, None, None, :]
    return F.linear(_merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)), w_o)


def attend_with_cache(x_new, num_heads, w_q, w_k, w_v, w_o, cache=None):
    q, k, v = (_split(F.linear(x_new, w), num_heads) for w in (w_q, w_k, w_v))
    if cache is not None:
        k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
    mask = causal_mask(q.shape[2], k.shape[2], device=x_new.device)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.linear(_merge(out), w_o), (k, v)
'''


def _hints(result) -> list[str]:
    return [check.hint or "" for check in result.failed_checks]


def _failed(result) -> dict[str, str]:
    """Failed checks of an exercise: {title: message}."""
    return {check.check: check.message for check in result.failed_checks}


def test_the_solution_gets_full_marks(grade_source):
    report = grade_source(SOLUTION, chapter="ch04")
    assert report.passed, [(r.exercise.name, r.reason) for r in report.exercises]
    assert report.score == report.max_score == 8


def test_the_stubs_score_zero(grade_source):
    report = grade_source(stub_source(CH04), chapter="ch04")
    assert report.score == 0
    assert set(statuses(report).values()) == {"not implemented"}


def test_a_correct_implementation_written_differently_gets_full_marks(grade_source):
    report = grade_source(ALTERNATIVE, chapter="ch04")
    assert report.passed, [(r.exercise.name, r.reason) for r in report.exercises]


def test_is_causal_with_a_cache_is_named_top_left(grade_source):
    # The trap of the chapter: is_causal=True aligns top-left, so a new
    # token sees only the first keys of the cache.
    source = replace_function(SOLUTION, "attend_with_cache", '''
def attend_with_cache(x_new, num_heads, w_q, w_k, w_v, w_o, cache=None):
    import torch.nn.functional as F
    batch, length, _ = x_new.shape
    q, k, v = (x_new @ w.T for w in (w_q, w_k, w_v))
    q, k, v = (t.view(batch, length, num_heads, -1).transpose(1, 2) for t in (q, k, v))
    if cache is not None:
        k = torch.cat([cache[0], k], dim=-2)
        v = torch.cat([cache[1], v], dim=-2)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return heads.transpose(1, 2).reshape(batch, length, -1) @ w_o.T, (k, v)
''')
    report = grade_source(source, chapter="ch04")
    result = result_of(report, "attend_with_cache")
    assert result.status == "failed"
    assert statuses(report)["causal_self_attention"] == "passed"
    assert any("top-left" in hint and "is_causal=True" in hint and "i + S - L" in hint
               for hint in _hints(result))
    failed = _failed(result)
    assert any("token-by-token" in message for message in failed.values())
    assert any("chunks of [3, 1, 2]" in message for message in failed.values())


def test_a_mask_that_hides_the_diagonal_says_which_keys_a_row_sees(grade_source):
    # j < i instead of j <= i: the same mistake as triu(diagonal=0).
    source = replace_function(SOLUTION, "causal_mask", '''
def causal_mask(num_queries, num_keys=None, device=None):
    num_keys = num_queries if num_keys is None else num_keys
    rows = torch.arange(num_queries, device=device)[:, None]
    columns = torch.arange(num_keys, device=device)[None, :]
    return columns < rows + (num_keys - num_queries)
''')
    result = result_of(grade_source(source, chapter="ch04"), "causal_mask")
    assert result.status == "failed"
    assert any("diagonal" in hint and "see itself" in hint for hint in _hints(result))
    messages = " ".join(_failed(result).values())
    assert "row 0 lets query 0 see no key, expected keys [0]" in messages
    assert "blocks a token from itself" in messages


def test_leaking_the_future_fails_the_causality_checks(grade_source):
    # No mask at all, written with PyTorch's attention: every output sees
    # every token, and the two causality properties say so.
    source = replace_function(SOLUTION, "causal_self_attention", '''
def causal_self_attention(x, num_heads, w_q, w_k, w_v, w_o, lengths=None):
    import torch.nn.functional as F
    batch, length, _ = x.shape
    q, k, v = (x @ w.T for w in (w_q, w_k, w_v))
    q, k, v = (t.view(batch, length, num_heads, -1).transpose(1, 2) for t in (q, k, v))
    heads = F.scaled_dot_product_attention(q, k, v)
    return heads.transpose(1, 2).reshape(batch, length, -1) @ w_o.T
''')
    result = result_of(grade_source(source, chapter="ch04"), "causal_self_attention")
    assert result.status == "failed"
    failed = _failed(result)
    leak = failed["changing later tokens changes no earlier output"]
    assert "a later token leaks into an earlier output" in leak
    gradient = failed["output t has zero gradient with respect to tokens after t (autograd, float64)"]
    assert "output 0 depends on a later token" in gradient


def test_a_gradient_that_holds_nan_is_said_to_hold_nan_not_zero(grade_source):
    # An inverted mask leaves the last query no key, and a plain softmax gives
    # it NaN, which reaches every entry of the gradient: NaN fails both of the
    # gradient check's tests, which would call it zero.
    source = SOLUTION.replace('scores.masked_fill(~mask, float("-inf"))',
                              'scores.masked_fill(mask, float("-inf"))')
    source = source.replace("torch.softmax(scores.masked_fill(no_keys, 0.0), dim=-1).masked_fill(no_keys, 0.0)",
                            "torch.softmax(scores, dim=-1)")
    assert source.count("torch.softmax(scores, dim=-1)") == 1 and 'masked_fill(mask, float("-inf"))' in source
    report = grade_source(source, chapter="ch04", only={"causal_self_attention"})
    gradient = _failed(result_of(report, "causal_self_attention"))[
        "output t has zero gradient with respect to tokens after t (autograd, float64)"]
    assert "NaN at [" in gradient and "every key of that query masked" in gradient, gradient
    assert "is zero" not in gradient


def test_ignoring_the_lengths_fails_only_the_padding_checks(grade_source):
    source = SOLUTION.replace("    if lengths is not None:\n        keys = ",
                              "    if False:  # lengths forgotten\n        keys = ")
    assert source != SOLUTION
    result = result_of(grade_source(source, chapter="ch04"), "causal_self_attention")
    assert result.status == "failed"
    failed = _failed(result)
    assert failed, "ignoring lengths must fail"
    for title, message in failed.items():
        assert "lengths" in message, title
    assert any("lengths [5, 3, 0, 1]" in message for message in failed.values())


def test_returning_float32_for_float16_inputs_names_the_dtype(grade_source):
    # Computing in float32 for accuracy is fine; forgetting to cast back is not.
    source = SOLUTION.replace(
        "    batch, length, _ = x.shape\n    q, k, v = (x @ w.T",
        "    if x.dtype in (torch.float16, torch.bfloat16):\n"
        "        x, w_q, w_k, w_v, w_o = (t.float() for t in (x, w_q, w_k, w_v, w_o))\n"
        "    batch, length, _ = x.shape\n    q, k, v = (x @ w.T")
    assert source != SOLUTION
    result = result_of(grade_source(source, chapter="ch04"), "causal_self_attention")
    assert result.status == "failed"
    failed = _failed(result)
    assert set(failed) == {"works in float16 and bfloat16 (compared with the float32 reference) [float16]",
                           "works in float16 and bfloat16 (compared with the float32 reference) [bfloat16]"}
    assert "has dtype torch.float32, expected torch.float16" in " ".join(failed.values())


def test_changing_the_cache_in_place_is_refused(grade_source):
    # "Saving work" by scaling the cached keys where they are: the caller's
    # cache changes, and the next step would scale them again.
    source = SOLUTION.replace(
        "    if cache is not None:\n        k = torch.cat([cache[0], k], dim=-2)",
        "    if cache is not None:\n        cache[0].mul_(1.0 / math.sqrt(q.shape[-1]))\n"
        "        k = torch.cat([cache[0], k], dim=-2)")
    assert source != SOLUTION
    result = result_of(grade_source(source, chapter="ch04"), "attend_with_cache")
    assert result.status == "failed"
    messages = list(_failed(result).values())
    assert any("changed its input cache in place" in message for message in messages)
    # Messages describe the cache by its shapes, never by its values.
    assert all("tensor(" not in message for message in messages)


def test_a_cache_without_the_new_tokens_fails_with_its_shape(grade_source):
    # Returning only what came in (here: nothing, on the first step) makes
    # the next step forget the new tokens.
    source = SOLUTION.replace("return heads @ w_o.T, (k, v)",
                              "return heads @ w_o.T, (k[:, :, :0], v[:, :, :0])")
    assert source != SOLUTION
    result = result_of(grade_source(source, chapter="ch04"), "attend_with_cache")
    assert result.status == "failed"
    messages = " ".join(_failed(result).values())
    assert "the key cache returned by attend_with_cache" in messages
    assert "has shape (2, 2, 0, 4), expected (2, 2, 4, 4)" in messages


def test_an_inline_mask_that_hides_the_diagonal_is_named(grade_source):
    # The mask written in causal_self_attention itself, with j < i for j <= i:
    # token 0 sees nothing and every other token misses itself.
    source = SOLUTION.replace(
        "    mask = causal_mask(length, device=x.device)  # (T, T), where the scores are\n",
        "    positions = torch.arange(length, device=x.device)\n"
        "    mask = positions[None, :] < positions[:, None]  # (T, T)\n")
    assert source != SOLUTION
    report = grade_source(source, chapter="ch04")
    assert statuses(report) == {"causal_mask": "passed", "causal_self_attention": "failed",
                                "attend_with_cache": "passed"}
    result = result_of(report, "causal_self_attention")
    assert result.reason.startswith("looks like the causal mask blocks the diagonal too")
    failed = _failed(result)
    gradient = failed["output t has zero gradient with respect to tokens after t (autograd, float64)"]
    assert "output 0 must depend on itself and the past" in gradient


# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py); a class's args
    are ``(init args, call args, call kwargs)``."""
    x = draw.randn(2, 5, 8)
    projections = (draw.weights(8, 8), draw.weights(8, 8), draw.weights(6, 8), draw.weights(4, 6))
    cache = (draw.randn(2, 2, 4, 4), draw.randn(2, 2, 4, 3))
    return [
        ("causal_mask", (4,), {}),
        ("causal_mask", (3, 6), {}),
        ("causal_self_attention", (x, 2, *projections), {}),
        ("causal_self_attention", (x, 2, *projections), {"lengths": torch.tensor([5, 0])}),
        ("attend_with_cache", (draw.randn(2, 3, 8), 2, *projections), {"cache": cache}),
        ("attend_with_cache", (draw.randn(2, 3, 8), 2, *projections), {}),
    ]


# The known bug tests/test_release.py makes in the edition and in this tree.
RELEASE_BUG = ("causal_mask", "top-left")
