"""Chapter 1 in the style of Meta's llama reference code.

The habit taken from llama's ``Attention.forward``: the softmax is always
computed in float32, ``F.softmax(scores.float(), dim=-1).type_as(xq)``, and
cast back to the dtype of the queries (for half precision an upcast, for
float64 a downcast). Masks are additive, built with ``torch.full(...,
float("-inf"))`` on the inputs' device, projections are ``F.linear`` as in
``self.wq(x)``. The hand-written softmax follows the same rule: float32
inside, the input's dtype outside. The NumPy part is the plain textbook one.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    xf = x.float()
    m = xf.amax(dim=dim, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(xf - m)
    return (e / e.sum(dim=dim, keepdim=True)).type_as(x)


def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    head_dim = q.shape[-1]
    if scale is None:
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
    else:
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if mask is not None:
        if mask.dtype == torch.bool:
            # llama adds a float mask; turn True/False into 0/-inf first
            additive = torch.full(mask.shape, float("-inf"), dtype=scores.dtype, device=scores.device)
            mask = additive.masked_fill(mask, 0.0)
        scores = scores + mask  # (..., L, S)
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)
    scores = F.softmax(scores.masked_fill(empty, 0.0).float(), dim=-1).type_as(q)
    scores = scores.masked_fill(empty, 0.0)
    output = torch.matmul(scores, v)  # (..., L, d_v)
    return output, scores


def self_attention(x, w_q, w_k, w_v, mask=None):
    xq, xk, xv = F.linear(x, w_q), F.linear(x, w_k), F.linear(x, w_v)
    return scaled_dot_product_attention(xq, xk, xv, mask=mask)


def softmax_numpy(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    m[~np.isfinite(m)] = 0
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True)


def scaled_dot_product_attention_numpy(q, k, v, mask=None):
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    empty = np.isneginf(scores).all(axis=-1, keepdims=True)
    weights = softmax_numpy(np.where(empty, 0.0, scores), axis=-1)
    weights = np.where(empty, 0.0, weights)
    return np.matmul(weights, v), weights
