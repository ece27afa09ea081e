"""Chapter 7's oracles: PyTorch's softmax, its attention with chapter 4's
bottom-right causal mask, and attention over a set of keys with the log of
its sum of exp(score), whole or split into two parts of keys.

Shapes: x ``(..., N)``; q ``(..., L, d)``, k ``(..., S, d)``, v ``(..., S,
d_v)``; an output ``(..., L, d_v)`` and its log-sum-exp ``(..., L)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["attention", "attention_with_lse", "bottom_right_mask", "softmax", "split_parts"]


def softmax(x):
    """``torch.softmax(x, dim=-1)``."""
    return torch.softmax(x, dim=-1)


def bottom_right_mask(num_queries, num_keys):
    """Chapter 4's causal mask ``(L, S)``, True = may attend: query i sees keys 0 .. i + S - L."""
    return torch.ones(num_queries, num_keys, dtype=torch.bool).tril(num_keys - num_queries)


def attention(q, k, v, causal=False):
    """``F.scaled_dot_product_attention``, with the bottom-right causal mask
    when ``causal``; a query with no visible key gets zeros, as in this course."""
    mask = bottom_right_mask(q.shape[-2], k.shape[-2]) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_with_lse(q, k, v):
    """``(output, lse)`` of attention over these keys: PyTorch's output, and
    the log of the sum of exp(score) (``-inf`` with no key, output zeros)."""
    if k.shape[-2] == 0:
        return q.new_zeros(*q.shape[:-1], v.shape[-1]), q.new_full(q.shape[:-1], float("-inf"))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., L, S)
    return F.scaled_dot_product_attention(q, k, v), torch.logsumexp(scores, dim=-1)


def split_parts(q, k, v, split):
    """``(out_a, lse_a, out_b, lse_b)``: ``attention_with_lse`` over keys
    ``0 .. split - 1`` and over the rest."""
    out_a, lse_a = attention_with_lse(q, k[..., :split, :], v[..., :split, :])
    out_b, lse_b = attention_with_lse(q, k[..., split:, :], v[..., split:, :])
    return out_a, lse_a, out_b, lse_b
