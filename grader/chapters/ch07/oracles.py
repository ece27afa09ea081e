"""Chapter 7's oracles: PyTorch's softmax, and attention over a set of keys
(with chapter 4's bottom-right causal mask when causal) together with the
log of its sum of exp(score), whole or split into two parts of keys.

Shapes: x ``(..., N)``; q ``(..., L, d)``, k ``(..., S, d)``, v ``(..., S,
d_v)``; an output ``(..., L, d_v)`` and its log-sum-exp ``(..., L)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["attention_with_lse", "bottom_right_mask", "softmax", "split_parts"]


def softmax(x):
    """``torch.softmax(x, dim=-1)``."""
    return torch.softmax(x, dim=-1)


def bottom_right_mask(num_queries, num_keys):
    """Chapter 4's causal mask ``(L, S)``, True = may attend: query i sees keys 0 .. i + S - L."""
    return torch.ones(num_queries, num_keys, dtype=torch.bool).tril(num_keys - num_queries)


def attention_with_lse(q, k, v, causal=False):
    """``(output, lse)`` of attention over these keys: ``F.scaled_dot_product_attention``
    (with the bottom-right causal mask as ``attn_mask`` when ``causal``), and
    ``torch.logsumexp`` of the scaled scores, masked ones set to ``-inf``. A
    query with no visible key (or no key at all) gets zeros and ``-inf``:
    torch >= 2.5 gives zeros for a fully masked row."""
    if k.shape[-2] == 0:
        return q.new_zeros(*q.shape[:-1], v.shape[-1]), q.new_full(q.shape[:-1], float("-inf"))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., L, S)
    mask = None
    if causal:
        mask = bottom_right_mask(q.shape[-2], k.shape[-2])  # (L, S)
        scores = scores.masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), torch.logsumexp(scores, dim=-1)


def split_parts(q, k, v, split):
    """``(out_a, lse_a, out_b, lse_b)``: ``attention_with_lse`` over keys
    ``0 .. split - 1`` and over the rest."""
    out_a, lse_a = attention_with_lse(q, k[..., :split, :], v[..., :split, :])
    out_b, lse_b = attention_with_lse(q, k[..., split:, :], v[..., split:, :])
    return out_a, lse_a, out_b, lse_b
