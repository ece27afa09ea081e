"""Independent answers: what the checks compare with besides the reference.

Each chapter's oracles are ``grader/chapters/chNN/oracles.py``, written from
PyTorch's own functions and from other people's code (Meta's complex RoPE,
Hugging Face's ``rotate_half``, a loop over heads), never from the course's
solutions, so that a mistake shared by the reference and a student cannot
hide. This module holds what several chapters use: PyTorch's own attention
(with its log-sum-exp, for the tiled chapters 7 and 9), and gradients of any
of them.

An oracle computes an exercise's answer, so the student edition holds none
of them: checks reach the oracles through ``grader.checks.Oracles``, which
answers from the recordings there, as the reference does
(``grader.recorded``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def attention(q, k, v, mask=None, scale=None):
    """``(output, weights)``: output from ``F.scaled_dot_product_attention``,
    weights from ``torch.softmax``; a query with no key gets zeros in both,
    as in ``F.scaled_dot_product_attention``.

    Shapes: q ``(..., L, d_k)``, k ``(..., S, d_k)``, v ``(..., S, d_v)``,
    mask broadcastable to ``(..., L, S)`` (bool True = attend, or additive).
    """
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1)
    return output, torch.nan_to_num(weights, nan=0.0)


def gradients(function, args, wrt, grad_output):
    """Gradients of ``<function(*args), grad_output>`` with respect to the
    arguments at the indices ``wrt``, computed here (use float64 inputs)."""
    leaves = [a.detach().clone().requires_grad_(i in wrt) for i, a in enumerate(args)]
    scalar = (function(*leaves) * grad_output).sum()  # as the worker does it
    return torch.autograd.grad(scalar, [leaves[i] for i in wrt])


def multihead_attention(module: torch.nn.MultiheadAttention, query, key, value,
                        key_padding_mask=None, **kwargs):
    """``module(query, key, value, key_padding_mask=key_padding_mask, **kwargs)``.

    The padding mask reaches the module as the ``(N * H, L, S)`` attn_mask
    that the module would turn it into itself, because the module checks a
    key_padding_mask's shape with ``torch._check_with``, whose first call
    imports sympy, a costly import a grade does without. Shapes: query
    ``(N, L, E)`` when ``module.batch_first``, else ``(L, N, E)``;
    key_padding_mask ``(N, S)``, bool (True = ignore) or additive.
    """
    if key_padding_mask is None:
        return module(query, key, value, **kwargs)
    if kwargs.get("attn_mask") is not None:
        raise ValueError("give either key_padding_mask or attn_mask")
    batch, length = (query.shape[0], query.shape[1]) if module.batch_first else (query.shape[1], query.shape[0])
    keys = key_padding_mask.shape[-1]
    per_head = key_padding_mask.reshape(batch, 1, 1, keys).expand(batch, module.num_heads, length, keys)
    return module(query, key, value, attn_mask=per_head.reshape(batch * module.num_heads, length, keys),
                  **kwargs)


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
