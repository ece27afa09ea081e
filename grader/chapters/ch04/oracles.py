"""Chapter 4's oracles: the causal mask as ``tril``, causal multi-head
self-attention from ``F.linear`` and ``F.scaled_dot_product_attention``, its
gradients by autograd, and the keys and values a cache holds.

Shapes: x ``(B, T, d_model)``; weights in ``nn.Linear`` layout: w_q, w_k
``(D, d_model)``, w_v ``(D_v, d_model)``, w_o ``(d_out, D_v)``, with
``D = H * d``; lengths ``(B,)`` int64 (real tokens first, then padding);
heads ``(B, H, T, d)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grader.oracles import gradients

__all__ = ["causal_mask", "causal_self_attention", "causal_self_attention_gradients", "keys_and_values",
           "split_heads"]


def causal_mask(num_queries, num_keys):
    """Bottom-right causal mask ``(L, S)``: query i is token i + S - L and
    sees keys 0 .. i + S - L."""
    return torch.ones(num_queries, num_keys, dtype=torch.bool).tril(num_keys - num_queries)


def split_heads(t, num_heads):
    """``(B, T, D) -> (B, H, T, d)``."""
    batch, length, _ = t.shape
    return t.view(batch, length, num_heads, -1).transpose(1, 2)  # (B, H, T, d)


def causal_self_attention(x, num_heads, w_q, w_k, w_v, w_o, lengths=None):
    """Causal multi-head self-attention from ``F.linear`` and
    ``F.scaled_dot_product_attention``: ``(B, T, d_out)``; a query with no
    key (a sequence of length 0) gets ``w_o`` of zeros."""
    batch, length, _ = x.shape
    q, k, v = (split_heads(F.linear(x, w), num_heads) for w in (w_q, w_k, w_v))  # (B, H, T, d)
    if lengths is None:  # L == S: is_causal's top-left alignment is right here
        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        keys = torch.arange(length)[None, :] < lengths[:, None]  # (B, T)
        allowed = causal_mask(length, length) & keys[:, None, None, :]  # (B, 1, T, T)
        heads = torch.nan_to_num(F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))
    return F.linear(heads.transpose(1, 2).reshape(batch, length, -1), w_o)  # (B, T, d_out)


def causal_self_attention_gradients(x, num_heads, w_q, w_k, w_v, w_o, lengths, upstream):
    """Gradients of ``<causal_self_attention(...), upstream>`` with respect to
    x and the four weights."""
    return gradients(lambda t, *w: causal_self_attention(t, num_heads, *w, lengths=lengths),
                     [x, w_q, w_k, w_v, w_o], [0, 1, 2, 3, 4], upstream)


def keys_and_values(x, num_heads, w_k, w_v):
    """``(k, v)``: every token's key and value, split into heads: ``(B, H, T, d)``
    and ``(B, H, T, d_v)``, what a cache holds after reading all of x."""
    return split_heads(F.linear(x, w_k), num_heads), split_heads(F.linear(x, w_v), num_heads)
