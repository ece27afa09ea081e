"""Chapter 4 by a student who keeps masks on the right device without device=.

Instead of passing ``device=`` to every factory call, this student opens a
``with torch.device(x.device):`` block and builds masks inside it (PyTorch
then creates every tensor there); derives masks from the data with
``x.new_ones(...)``; and, for the cache, builds the mask once with the
default-device ``causal_mask`` and copies it into a tensor allocated where
the scores are: ``torch.empty(..., device=x.device).copy_(cpu_mask)``. The
mask itself is written as a comparison of positions,
``key_position <= query_position``, query i sitting at position i + S - L.
Heads are split with ``unflatten`` and ``permute``.
"""

import contextlib
import math

import torch


def causal_mask(num_queries, num_keys=None, device=None):
    if num_keys is None:
        num_keys = num_queries
    where = torch.device(device) if device is not None else contextlib.nullcontext()
    with where:
        query_position = torch.arange(num_queries)[:, None] + (num_keys - num_queries)  # (L, 1)
        key_position = torch.arange(num_keys)[None, :]  # (1, S)
        return key_position <= query_position  # (L, S)


def _split(t, num_heads):
    return t.unflatten(-1, (num_heads, -1)).permute(0, 2, 1, 3)  # (B, T, D) -> (B, H, T, d)


def _merge(t):
    return t.permute(0, 2, 1, 3).flatten(2)  # (B, H, T, d) -> (B, T, D)


def _attend(q, k, v, allowed):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    has_key = allowed.any(dim=-1, keepdim=True)  # False for a sequence of length 0
    weights = torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1)
    return (weights * has_key) @ v


def causal_self_attention(x, num_heads, w_q, w_k, w_v, w_o, lengths=None):
    length = x.shape[1]
    q, k, v = (_split(x @ w.T, num_heads) for w in (w_q, w_k, w_v))  # (B, H, T, ·)
    with torch.device(x.device):
        allowed = torch.ones(length, length, dtype=torch.bool).tril()  # (T, T)
        if lengths is not None:
            real = torch.arange(length) < lengths[:, None]  # (B, T)
            allowed = allowed & real[:, None, None, :]  # (B, 1, T, T)
    return _merge(_attend(q, k, v, allowed)) @ w_o.T


def attend_with_cache(x_new, num_heads, w_q, w_k, w_v, w_o, cache=None):
    new = x_new.shape[1]
    q, k, v = (_split(x_new @ w.T, num_heads) for w in (w_q, w_k, w_v))
    if cache is not None:
        k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
    total = k.shape[2]
    if cache is None:
        allowed = x_new.new_ones(new, new, dtype=torch.bool).tril()  # no past: plain lower triangle
    else:
        cpu_mask = causal_mask(new, total)  # on the default device
        allowed = torch.empty(new, total, dtype=torch.bool, device=x_new.device).copy_(cpu_mask)
    return _merge(_attend(q, k, v, allowed)) @ w_o.T, (k, v)
