"""Chapter 3 on PyTorch 2's fused attention.

The style of a student who reaches for ``F.scaled_dot_product_attention``
(allowed from chapter 2 on) whenever the attention weights themselves are
not wanted, and writes the weights out by hand only when they are: the
module's ``need_weights=True``, and dropout in training, whose dropped
weights the caller may ask to see. Shapes move with ``unflatten`` and
``movedim``; bool masks go to SDPA as they are (True = may attend is SDPA's
convention too), and nn.MultiheadAttention's key_padding_mask is inverted on
the way in. A query with no key at all comes out of SDPA as zeros on recent
PyTorch and as NaN on older releases: ``nan_to_num`` makes both zeros.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    if x.size(-1) % num_heads != 0:
        raise ValueError(f"num_heads={num_heads} does not divide the width {x.size(-1)}")
    return x.unflatten(-1, (num_heads, -1)).movedim(-2, -3)  # (..., T, H, d) -> (..., H, T, d)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    return x.movedim(-3, -2).flatten(-2)  # (..., T, H, d) -> (..., T, H * d)


def _fused(q, k, v, mask=None, dropout_p=0.0):
    """SDPA over (..., H, T, d) tensors; zeros (not NaN) for a query with no key."""
    if mask is not None:
        # SDPA wants the mask's batch dimensions to match or broadcast like the scores'.
        mask = mask.expand(*q.shape[:-1], k.shape[-2])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    return out if mask is None else torch.nan_to_num(out, nan=0.0)


def multi_head_attention(query, key, value, num_heads, w_q, w_k, w_v, w_o, mask=None):
    q = split_heads(F.linear(query, w_q), num_heads)  # (..., H, L, d)
    k = split_heads(F.linear(key, w_k), num_heads)  # (..., H, S, d)
    v = split_heads(F.linear(value, w_v), num_heads)  # (..., H, S, d_v)
    batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    q, k, v = (t.expand(*batch, *t.shape[-3:]) for t in (q, k, v))
    return F.linear(merge_heads(_fused(q, k, v, mask)), w_o)  # (..., L, d_out)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"num_heads={num_heads} does not divide d_model={d_model}")
        self.num_heads = num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, mask=None, need_weights=False):
        q, k, v = (split_heads(t, self.num_heads) for t in self.qkv(x).chunk(3, dim=-1))
        p = self.dropout if self.training else 0.0
        if not need_weights:
            return self.out(merge_heads(_fused(q, k, v, mask, dropout_p=p)))
        # The weights are wanted: the explicit path, so that they can be returned.
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., H, T, T)
        if mask is not None:
            scores = scores.masked_fill(mask.logical_not(), float("-inf"))
        weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        weights = F.dropout(weights, p=p, training=self.training)
        return self.out(merge_heads(weights @ v)), weights


def torch_multihead_forward(query, key, value, num_heads, in_proj_weight, in_proj_bias,
                            out_proj_weight, out_proj_bias, key_padding_mask=None,
                            batch_first=False):
    if not batch_first:
        query, key, value = (t.movedim(1, 0) for t in (query, key, value))  # (N, ·, E)
    b_q = b_k = b_v = None
    if in_proj_bias is not None:
        b_q, b_k, b_v = in_proj_bias.chunk(3)
    w_q, w_k, w_v = in_proj_weight.chunk(3)
    q = split_heads(F.linear(query, w_q, b_q), num_heads)  # (N, H, L, d)
    k = split_heads(F.linear(key, w_k, b_k), num_heads)  # (N, H, S, d)
    v = split_heads(F.linear(value, w_v, b_v), num_heads)  # (N, H, S, d)
    mask = None
    if key_padding_mask is not None:
        mask = key_padding_mask.logical_not()[:, None, None, :]  # (N, 1, 1, S), True = attend
    out = F.linear(merge_heads(_fused(q, k, v, mask)), out_proj_weight, out_proj_bias)  # (N, L, E)
    return out if batch_first else out.movedim(0, 1)


def parameter_count(d_model: int, num_heads: int, bias: bool = True) -> int:
    weights = (3 * d_model) * d_model + d_model * d_model  # in_proj (3D, D) and out_proj (D, D)
    biases = 3 * d_model + d_model if bias else 0
    return weights + biases
