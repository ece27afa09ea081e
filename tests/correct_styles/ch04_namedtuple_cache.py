"""Chapter 4 by a student who keeps the KV cache in a namedtuple and
explains the shape errors of their projections.

The cache is a ``KVCache(keys, values)`` namedtuple, grown with
``cache._replace(keys=torch.cat(...))`` and handed back as a plain tuple,
as the docstring asks. Every projection goes through ``_project``: when a
matrix product fails on its shapes, it takes the error from
``sys.exc_info()``, formats it with ``traceback`` into an ``io.StringIO``
and raises a ``ValueError`` that names the shapes involved. The causal mask
compares two ``arange``s, ``j <= i + S - L``, instead of cutting a triangle.
"""

import io
import math
import sys
import traceback
from collections import namedtuple

import torch

KVCache = namedtuple("KVCache", ["keys", "values"])


def _explained(error_info, **tensors) -> str:
    """The error ``sys.exc_info()`` gave, and the shapes of ``tensors``."""
    kind, error, trace = error_info
    report = io.StringIO()
    traceback.print_exception(kind, error, trace, limit=1, file=report)
    for name, tensor in tensors.items():
        print(f"  {name}: {tuple(tensor.shape)}", file=report)
    return report.getvalue()


def _project(x, w, num_heads):
    """``x @ w.T`` split into heads: (B, T, d_model) -> (B, H, T, D // H)."""
    try:
        y = x @ w.T
    except RuntimeError:
        raise ValueError("a projection does not fit its input:\n" + _explained(sys.exc_info(), x=x, w=w)) from None
    batch, length, width = y.shape
    return y.reshape(batch, length, num_heads, width // num_heads).permute(0, 2, 1, 3)


def causal_mask(num_queries, num_keys=None, device=None):
    num_keys = num_queries if num_keys is None else num_keys
    i = torch.arange(num_queries, device=device)[:, None]  # (L, 1)
    j = torch.arange(num_keys, device=device)[None, :]  # (1, S)
    return j <= i + (num_keys - num_queries)  # (L, S)


def _attend(q, k, v, mask):
    """(B, H, L, d) queries over (B, H, S, d) keys; a query with no key gets zeros."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~mask, float("-inf"))
    empty = scores.isneginf().all(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(empty, 0), dim=-1).masked_fill(empty, 0)
    out = torch.matmul(weights, v)  # (B, H, L, d_v)
    return out.permute(0, 2, 1, 3).flatten(2)  # (B, L, D_v)


def causal_self_attention(x, num_heads, w_q, w_k, w_v, w_o, lengths=None):
    q, k, v = (_project(x, w, num_heads) for w in (w_q, w_k, w_v))
    length = x.size(1)
    mask = causal_mask(length, device=x.device)  # (T, T)
    if lengths is not None:
        real = torch.arange(length, device=x.device)[None, :] < lengths[:, None]  # (B, T)
        mask = mask & real[:, None, None, :]  # (B, 1, T, T)
    return _attend(q, k, v, mask) @ w_o.T


def attend_with_cache(x_new, num_heads, w_q, w_k, w_v, w_o, cache=None):
    q = _project(x_new, w_q, num_heads)
    step = KVCache(_project(x_new, w_k, num_heads), _project(x_new, w_v, num_heads))
    if cache is not None:
        past = KVCache(*cache)
        step = step._replace(keys=torch.cat([past.keys, step.keys], dim=2),
                             values=torch.cat([past.values, step.values], dim=2))
    mask = causal_mask(x_new.size(1), step.keys.size(2), device=x_new.device)
    return _attend(q, step.keys, step.values, mask) @ w_o.T, tuple(step)
