"""Chapter 3, one head at a time.

The style of a student who pictures multi-head attention as H small
single-head attentions side by side: every function walks over the heads
with a Python loop, slices each head's rows out of the projection weights
(or its block of features out of the projections), and glues the heads back
with torch.stack / torch.cat. The output projection is applied head by head
too and summed, since w_o's columns split the same way the heads do.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    width = x.shape[-1]
    if width % num_heads != 0:
        raise ValueError(f"cannot split {width} features into {num_heads} equal heads")
    d = width // num_heads
    pieces = []
    for h in range(num_heads):
        pieces.append(x[..., h * d:(h + 1) * d])  # (..., T, d)
    return torch.stack(pieces, dim=-3)  # (..., H, T, d)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    pieces = []
    for h in range(x.shape[-3]):
        pieces.append(x[..., h, :, :])  # (..., T, d)
    return torch.cat(pieces, dim=-1)  # (..., T, H * d)


def _mask_of_head(mask, h):
    """The part of a mask broadcastable to (..., H, L, S) that head h uses."""
    if mask is None or mask.dim() < 3:
        return mask  # (L, S) or (S,): the same for every head
    if mask.shape[-3] == 1:
        return mask[..., 0, :, :]
    return mask[..., h, :, :]


def _one_head(q, k, v, allowed):
    """Single-head attention: q (..., L, d), k (..., S, d), v (..., S, d_v)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., L, S)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    # A row of -inf would give NaN; such a query gets no weights at all.
    nothing = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., L, 1)
    weights = torch.softmax(scores.masked_fill(nothing, 0.0), dim=-1)
    weights = weights.masked_fill(nothing, 0.0)  # (..., L, S)
    return weights @ v, weights


def multi_head_attention(query, key, value, num_heads, w_q, w_k, w_v, w_o, mask=None):
    d = w_q.shape[0] // num_heads
    d_v = w_v.shape[0] // num_heads
    output = None
    for h in range(num_heads):
        q = query @ w_q[h * d:(h + 1) * d].T  # (..., L, d)
        k = key @ w_k[h * d:(h + 1) * d].T  # (..., S, d)
        v = value @ w_v[h * d_v:(h + 1) * d_v].T  # (..., S, d_v)
        head, _ = _one_head(q, k, v, _mask_of_head(mask, h))  # (..., L, d_v)
        # This head's share of the output projection: its d_v columns of w_o.
        part = head @ w_o[:, h * d_v:(h + 1) * d_v].T  # (..., L, d_out)
        output = part if output is None else output + part
    return output


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not a multiple of num_heads={num_heads}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.p = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, mask=None, need_weights=False):
        projected = self.qkv(x)  # (..., T, 3D): [q | k | v]
        D, d = self.d_model, self.head_dim
        heads, all_weights = [], []
        for h in range(self.num_heads):
            q = projected[..., h * d:(h + 1) * d]  # (..., T, d)
            k = projected[..., D + h * d:D + (h + 1) * d]
            v = projected[..., 2 * D + h * d:2 * D + (h + 1) * d]
            _, weights = _one_head(q, k, v, _mask_of_head(mask, h))  # (..., T, T)
            weights = F.dropout(weights, p=self.p, training=self.training)
            heads.append(weights @ v)  # (..., T, d)
            all_weights.append(weights)
        output = self.out(torch.cat(heads, dim=-1))  # (..., T, D)
        if need_weights:
            return output, torch.stack(all_weights, dim=-3)  # (..., H, T, T)
        return output


def torch_multihead_forward(query, key, value, num_heads, in_proj_weight, in_proj_bias,
                            out_proj_weight, out_proj_bias, key_padding_mask=None,
                            batch_first=False):
    E = in_proj_weight.shape[1]
    d = E // num_heads
    if not batch_first:  # (L, N, E) -> (N, L, E)
        query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    if key_padding_mask is not None:
        allowed = ~key_padding_mask[:, None, :]  # (N, 1, S): True where a key may be seen
    else:
        allowed = None
    heads = []
    for h in range(num_heads):
        rows = [slot * E + h * d for slot in range(3)]  # where head h starts in W_q, W_k, W_v
        projections = []
        for tensor, start in zip((query, key, value), rows):
            weight = in_proj_weight[start:start + d]  # (d, E)
            bias = None if in_proj_bias is None else in_proj_bias[start:start + d]
            projections.append(F.linear(tensor, weight, bias))  # (N, ·, d)
        head, _ = _one_head(*projections, allowed)  # (N, L, d)
        heads.append(head)
    output = F.linear(torch.cat(heads, dim=-1), out_proj_weight, out_proj_bias)  # (N, L, E)
    return output if batch_first else output.transpose(0, 1)


def parameter_count(d_model: int, num_heads: int, bias: bool = True) -> int:
    total = 0
    for _projection in ("query", "key", "value", "output"):
        total += d_model * d_model  # its weight
        if bias:
            total += d_model  # its bias
    return total
