"""Chapter 1 written with explicit Python loops.

The student who thinks one query at a time: the softmax walks over rows,
attention walks over the (flattened) batch and then over the queries, each
projection is built one output feature at a time, and the NumPy versions
walk with ``np.ndindex``. Slow, but it reads like the math on the board.
"""

import math

import numpy as np
import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    out = torch.empty_like(rows)
    for i in range(rows.shape[0]):
        row = rows[i]
        biggest = row.max()
        if torch.isinf(biggest):  # the whole row is -inf: leave it unshifted
            biggest = torch.zeros_like(biggest)
        e = torch.exp(row - biggest)
        out[i] = e / e.sum()
    return out.reshape(moved.shape).movedim(-1, dim)


def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    L, d_k = q.shape[-2], q.shape[-1]
    S, d_v = k.shape[-2], v.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)

    shapes = [q.shape[:-2], k.shape[:-2], v.shape[:-2]]
    if mask is not None:
        shapes.append(mask.shape[:-2])
    batch = torch.broadcast_shapes(*shapes)

    # one flat batch axis, so that a single loop visits every (..., L, S) problem
    qs = q.expand(*batch, L, d_k).reshape(-1, L, d_k)
    ks = k.expand(*batch, S, d_k).reshape(-1, S, d_k)
    vs = v.expand(*batch, S, d_v).reshape(-1, S, d_v)
    ms = None
    if mask is not None:
        ms = mask.expand(*batch, L, S).reshape(-1, L, S)

    dtype = torch.promote_types(q.dtype, v.dtype)
    out = torch.zeros(qs.shape[0], L, d_v, dtype=dtype, device=q.device)
    weights = torch.zeros(qs.shape[0], L, S, dtype=dtype, device=q.device)
    for b in range(qs.shape[0]):
        for i in range(L):
            scores = (ks[b] @ qs[b, i]) * scale  # (S,)
            if ms is not None:
                if ms.dtype == torch.bool:
                    scores = scores.masked_fill(~ms[b, i], float("-inf"))
                else:
                    scores = scores + ms[b, i]
            if torch.isneginf(scores).all():
                continue  # nothing to attend to: the row stays zero
            w = softmax(scores, dim=-1)
            weights[b, i] = w
            out[b, i] = w @ vs[b]
    return out.reshape(*batch, L, d_v), weights.reshape(*batch, L, S)


def self_attention(x, w_q, w_k, w_v, mask=None):
    # feature j of q is the dot product of each token with row j of w_q
    q = torch.stack([x @ row for row in w_q], dim=-1)
    k = torch.stack([x @ row for row in w_k], dim=-1)
    v = torch.stack([x @ row for row in w_v], dim=-1)
    return scaled_dot_product_attention(q, k, v, mask=mask)


def softmax_numpy(x, axis=-1):
    moved = np.moveaxis(x, axis, -1)
    out = np.empty_like(moved)
    for index in np.ndindex(*moved.shape[:-1]):
        row = moved[index]
        biggest = row.max()
        if np.isinf(biggest):
            biggest = 0
        e = np.exp(row - biggest)
        out[index] = e / e.sum()
    return np.moveaxis(out, -1, axis)


def scaled_dot_product_attention_numpy(q, k, v, mask=None):
    L, S = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                                *([] if mask is None else [np.shape(mask)[:-2]]))
    qs = np.broadcast_to(q, batch + q.shape[-2:])
    ks = np.broadcast_to(k, batch + k.shape[-2:])
    vs = np.broadcast_to(v, batch + v.shape[-2:])
    ms = None if mask is None else np.broadcast_to(mask, batch + (L, S))

    scale = 1.0 / math.sqrt(q.shape[-1])
    out = np.zeros(batch + (L, v.shape[-1]), dtype=q.dtype)
    weights = np.zeros(batch + (L, S), dtype=q.dtype)
    for index in np.ndindex(*batch):
        for i in range(L):
            scores = (ks[index] @ qs[index][i]) * scale
            if ms is not None:
                scores = np.where(ms[index][i], scores, -np.inf)
            if np.isneginf(scores).all():
                continue
            w = softmax_numpy(scores)
            weights[index][i] = w
            out[index][i] = w @ vs[index]
    return out, weights
