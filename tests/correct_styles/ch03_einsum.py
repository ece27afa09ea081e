"""Chapter 3 with einsum everywhere.

The style of a student who writes every contraction and every axis move as
an einsum string: projections are "...ti,oi->...to" (nn.Linear's layout read
straight off the string), heads are split with unflatten and moved with a
one-operand einsum, and the output projection eats the heads axis directly
(w_o unflattened to (d_out, H, d_v)), so heads are never merged by hand.
nn.MultiheadAttention's sequence-first layout is kept as it comes: only the
einsum strings change with batch_first.
"""

import torch
import torch.nn.functional as F
from torch import nn


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    if x.shape[-1] % num_heads:
        raise ValueError(f"{x.shape[-1]} features do not split into {num_heads} heads")
    x = x.unflatten(-1, (num_heads, x.shape[-1] // num_heads))  # (..., T, H, d)
    return torch.einsum("...thd->...htd", x)  # (..., H, T, d)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    return torch.einsum("...htd->...thd", x).flatten(-2)  # (..., T, H * d)


def _project(x, weight, bias=None):
    """x @ weight.T (+ bias), spelled as an einsum."""
    y = torch.einsum("...i,oi->...o", x, weight)
    return y if bias is None else y + bias


def _attend(q, k, v, mask):
    """q (..., H, L, d), k (..., H, S, d), v (..., H, S, d_v); mask True = may attend."""
    scores = torch.einsum("...ld,...sd->...ls", q, k) * q.shape[-1] ** -0.5  # (..., H, L, S)
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # NaN in a row with no key at all
    # Rows with at least one key keep their softmax; the others get zeros.
    return torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)


def multi_head_attention(query, key, value, num_heads, w_q, w_k, w_v, w_o, mask=None):
    q = split_heads(_project(query, w_q), num_heads)  # (..., H, L, d)
    k = split_heads(_project(key, w_k), num_heads)  # (..., H, S, d)
    v = split_heads(_project(value, w_v), num_heads)  # (..., H, S, d_v)
    weights = _attend(q, k, v, mask)  # (..., H, L, S)
    heads = torch.einsum("...hls,...hsd->...hld", weights, v)  # (..., H, L, d_v)
    w_o = w_o.unflatten(-1, (num_heads, -1))  # (d_out, H, d_v)
    return torch.einsum("...hld,ohd->...lo", heads, w_o)  # (..., L, d_out)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, mask=None, need_weights=False):
        qkv = _project(x, self.qkv.weight, self.qkv.bias)  # (..., T, 3D)
        qkv = qkv.unflatten(-1, (3, self.num_heads, -1))  # (..., T, 3, H, d)
        q, k, v = torch.einsum("...tchd->c...htd", qkv)  # 3 x (..., H, T, d)
        weights = _attend(q, k, v, mask)  # (..., H, T, T)
        weights = F.dropout(weights, p=self.dropout, training=self.training)
        heads = torch.einsum("...hts,...hsd->...htd", weights, v)  # (..., H, T, d)
        w_o = self.out.weight.unflatten(-1, (self.num_heads, -1))  # (D, H, d)
        output = torch.einsum("...htd,ohd->...to", heads, w_o)  # (..., T, D)
        if self.out.bias is not None:
            output = output + self.out.bias
        return (output, weights) if need_weights else output


def torch_multihead_forward(query, key, value, num_heads, in_proj_weight, in_proj_bias,
                            out_proj_weight, out_proj_bias, key_padding_mask=None,
                            batch_first=False):
    # Letters for the layout as given: n batch, l query tokens, s key tokens.
    lq, ls = ("nl", "ns") if batch_first else ("ln", "sn")
    w = in_proj_weight.unflatten(0, (3, num_heads, -1))  # (3, H, d, E)
    b = (None,) * 3 if in_proj_bias is None else in_proj_bias.unflatten(0, (3, num_heads, -1))
    q = torch.einsum(f"{lq}e,hde->{lq}hd", query, w[0])  # layout of query, then (H, d)
    k = torch.einsum(f"{ls}e,hde->{ls}hd", key, w[1])
    v = torch.einsum(f"{ls}e,hde->{ls}hd", value, w[2])
    if in_proj_bias is not None:
        q, k, v = q + b[0], k + b[1], v + b[2]
    scores = torch.einsum(f"{lq}hd,{ls}hd->nhls", q, k) * q.shape[-1] ** -0.5  # (N, H, L, S)
    if key_padding_mask is not None:  # True = ignore, nn.MultiheadAttention's convention
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # every sequence keeps a key: no empty row
    heads = torch.einsum(f"nhls,{ls}hd->{lq}hd", weights, v)  # layout of query, (H, d)
    w_o = out_proj_weight.unflatten(-1, (num_heads, -1))  # (E, H, d)
    output = torch.einsum(f"{lq}hd,ehd->{lq}e", heads, w_o)
    return output if out_proj_bias is None else output + out_proj_bias


def parameter_count(d_model: int, num_heads: int, bias: bool = True) -> int:
    # Four D x D maps (q, k, v, out), each with a bias of D when bias=True.
    return 4 * d_model * (d_model + int(bias))
