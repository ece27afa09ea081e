"""Chapter 1 computed in float64 inside, with a log-sum-exp softmax.

The cautious numerics student: everything is promoted to double precision
(``x.double()``), the softmax is ``exp(x - logsumexp(x))`` instead of
max-shift-and-divide, and the answer is cast back to the caller's dtype at
the very end. A query with no key is found by its log-sum-exp being -inf.
"""

import math

import numpy as np
import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    xd = x.double()
    log_z = torch.logsumexp(xd, dim=dim, keepdim=True)
    return torch.exp(xd - log_z).to(x.dtype)


def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    out_dtype = q.dtype
    qd, kd, vd = q.double(), k.double(), v.double()
    if scale is None:
        scale = qd.shape[-1] ** -0.5
    scores = (qd @ kd.mT) * scale
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = torch.where(mask, scores, torch.full_like(scores, -math.inf))
        else:
            scores = scores + mask.double()
    log_z = torch.logsumexp(scores, dim=-1, keepdim=True)  # -inf: no key at all
    nothing = torch.isneginf(log_z)
    weights = softmax(torch.where(nothing, torch.zeros_like(scores), scores), dim=-1)
    weights = torch.where(nothing, torch.zeros_like(weights), weights)
    return (weights @ vd).to(out_dtype), weights.to(out_dtype)


def self_attention(x, w_q, w_k, w_v, mask=None):
    q = torch.matmul(x, w_q.t())
    k = torch.matmul(x, w_k.t())
    v = torch.matmul(x, w_v.t())
    return scaled_dot_product_attention(q, k, v, mask)


def _logsumexp_numpy(x, axis):
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return top + np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True))


def softmax_numpy(x, axis=-1):
    xd = x.astype(np.float64)
    return np.exp(xd - _logsumexp_numpy(xd, axis)).astype(x.dtype)


def scaled_dot_product_attention_numpy(q, k, v, mask=None):
    qd, kd, vd = (a.astype(np.float64) for a in (q, k, v))
    scores = qd @ np.swapaxes(kd, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    nothing = np.isneginf(scores).all(axis=-1, keepdims=True)
    weights = softmax_numpy(np.where(nothing, 0.0, scores), axis=-1)
    weights = np.where(nothing, 0.0, weights)
    return (weights @ vd).astype(q.dtype), weights.astype(q.dtype)
