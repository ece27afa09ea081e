"""Chapter 1 written with einsum everywhere.

The student who likes index notation: every contraction is an einsum string
("...ld,...sd->...ls"), in torch and in NumPy alike, the softmax's sum too,
and the max is the plain (not detached) ``max(...).values``.
"""

import math

import numpy as np
import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    # work on the last axis, then put the axis back where it was
    z = x.movedim(dim, -1)
    top = z.max(dim=-1, keepdim=True).values
    # a row of -inf only: shift it by 0 so we never compute -inf - -inf
    top = torch.where(top == float("-inf"), torch.zeros_like(top), top)
    e = torch.exp(z - top)
    total = torch.einsum("...i->...", e).unsqueeze(-1)
    return (e / total).movedim(-1, dim)


def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    if scale is None:
        scale = 1 / math.sqrt(q.size(-1))
    scores = torch.einsum("...ld,...sd->...ls", q, k) * scale
    if mask is not None:
        if mask.dtype is torch.bool:
            scores = scores.masked_fill(mask.logical_not(), float("-inf"))
        else:
            scores = scores + mask
    dead = scores.eq(float("-inf")).all(dim=-1, keepdim=True)
    attn = softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    out = torch.einsum("...ls,...sd->...ld", attn, v)
    return out, attn


def self_attention(x, w_q, w_k, w_v, mask=None):
    q = torch.einsum("...tm,km->...tk", x, w_q)
    k = torch.einsum("...tm,km->...tk", x, w_k)
    v = torch.einsum("...tm,vm->...tv", x, w_v)
    return scaled_dot_product_attention(q, k, v, mask=mask)


def softmax_numpy(x, axis=-1):
    z = np.moveaxis(x, axis, -1)
    top = z.max(axis=-1, keepdims=True)
    top = np.where(np.isneginf(top), np.zeros_like(top), top)
    e = np.exp(z - top)
    total = np.einsum("...i->...", e)[..., None]
    return np.moveaxis(e / total, -1, axis)


def scaled_dot_product_attention_numpy(q, k, v, mask=None):
    scores = np.einsum("...ld,...sd->...ls", q, k) / np.sqrt(q.shape[-1]).astype(q.dtype)
    if mask is not None:
        scores = np.where(mask, scores, np.array(-np.inf, dtype=scores.dtype))
    dead = np.isneginf(scores).all(axis=-1, keepdims=True)
    attn = softmax_numpy(np.where(dead, np.zeros_like(scores), scores), axis=-1)
    attn = np.where(dead, np.zeros_like(attn), attn)
    return np.einsum("...ls,...sd->...ld", attn, v), attn
