"""Correct code in the styles students and real codebases write keeps full
marks under the sandbox: the static scan, the worker's guards and the
kernel's layers refuse shortcuts, never an honest style.

Chapters 5 to 7 grade other people's styles in their own tests (Meta's
complex RoPE, Hugging Face's rotate_half and repeat_kv, FlashAttention's
loop orders); here, chapters 1, 3 and 4.
"""

from __future__ import annotations

import pytest

from conftest import replace_function, solution_source
from grader.catalog import find_chapter

EINSUM = {
    "softmax": '''
def softmax(x, dim=-1):
    # the classic: shift by the max (not detached), exponentiate, normalise
    e = (x - x.max(dim=dim, keepdim=True).values).exp()
    return e / e.sum(dim=dim, keepdim=True)
''',
    "scaled_dot_product_attention": '''
def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    scale = q.size(-1) ** -0.5 if scale is None else scale
    scores = torch.einsum("...ld,...sd->...ls", q, k) * scale
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(mask.logical_not(), float("-inf"))
        else:
            scores = scores + mask
    dead = scores.eq(float("-inf")).all(dim=-1, keepdim=True)
    weights = softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    return torch.einsum("...ls,...sd->...ld", weights, v), weights
''',
    "self_attention": '''
def self_attention(x, w_q, w_k, w_v, mask=None):
    # nn.Linear's convention, as Hugging Face's code reads it
    linear = torch.nn.functional.linear
    return scaled_dot_product_attention(linear(x, w_q), linear(x, w_k), linear(x, w_v), mask=mask)
''',
}

LOOP_OVER_HEADS = {
    "multi_head_attention": '''
def multi_head_attention(query, key, value, num_heads, w_q, w_k, w_v, w_o, mask=None):
    q, k, v = query @ w_q.T, key @ w_k.T, value @ w_v.T
    d, d_v = q.shape[-1] // num_heads, v.shape[-1] // num_heads
    length, keys = q.shape[-2], k.shape[-2]
    if mask is not None:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        mask = torch.broadcast_to(mask, batch + (num_heads, length, keys))
    heads = []
    for h in range(num_heads):
        q_h, k_h = q[..., h * d:(h + 1) * d], k[..., h * d:(h + 1) * d]
        v_h = v[..., h * d_v:(h + 1) * d_v]
        scores = q_h @ k_h.transpose(-2, -1) / math.sqrt(d)
        if mask is not None:
            scores = scores.masked_fill(~mask[..., h, :, :], float("-inf"))
        empty = torch.isinf(scores).all(dim=-1, keepdim=True)
        weights = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
        heads.append(weights @ v_h)
    return torch.cat(heads, dim=-1) @ w_o.T
''',
}

TRIU = {
    "causal_mask": '''
def causal_mask(num_queries, num_keys=None, device=None):
    # the Annotated Transformer's subsequent_mask, aligned bottom-right
    num_keys = num_queries if num_keys is None else num_keys
    future = torch.triu(torch.ones(num_queries, num_keys, dtype=torch.bool, device=device),
                        diagonal=num_keys - num_queries + 1)
    return future == 0
''',
}


@pytest.mark.parametrize("chapter, definitions", [
    ("ch01", EINSUM), ("ch03", LOOP_OVER_HEADS), ("ch04", TRIU),
], ids=["ch01-einsum", "ch03-loop-over-heads", "ch04-triu"])
def test_correct_code_in_other_styles_gets_full_marks(grade_source, chapter, definitions):
    source = solution_source(find_chapter(chapter))
    for name, definition in definitions.items():
        source = replace_function(source, name, definition)
    report = grade_source(source, chapter=chapter)
    failed = {result.exercise.name: result.reason for result in report.exercises if result.status != "passed"}
    assert failed == {}
