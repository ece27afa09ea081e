"""Chapter 7's oracles: PyTorch's softmax, and attention over a set of keys
(with chapter 4's bottom-right causal mask when causal) together with the
log of its sum of exp(score), whole or split into two parts of keys.

Shapes: x ``(..., N)``; q ``(..., L, d)``, k ``(..., S, d)``, v ``(..., S,
d_v)``; an output ``(..., L, d_v)`` and its log-sum-exp ``(..., L)``.
"""

from __future__ import annotations

import torch

from grader.oracles import attention_with_lse, bottom_right_mask

__all__ = ["attention_with_lse", "bottom_right_mask", "softmax", "split_parts"]


def softmax(x):
    """``torch.softmax(x, dim=-1)``."""
    return torch.softmax(x, dim=-1)


def split_parts(q, k, v, split):
    """``(out_a, lse_a, out_b, lse_b)``: ``attention_with_lse`` over keys
    ``0 .. split - 1`` and over the rest."""
    out_a, lse_a = attention_with_lse(q, k[..., :split, :], v[..., :split, :])
    out_b, lse_b = attention_with_lse(q, k[..., split:, :], v[..., split:, :])
    return out_a, lse_a, out_b, lse_b
