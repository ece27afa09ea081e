"""Chapter 3 after the Annotated Transformer (Harvard NLP).

The style of a student working from "The Annotated Transformer": a free
``attention(query, key, value, mask, dropout)`` function returning
``(output, p_attn)``; masked scores filled with -1e9 where ``mask == 0``;
projections in a list comprehension over ``zip(weights, (query, key,
value))`` followed by ``view(..., h, d_k).transpose``; the module keeps its
last weights in ``self.attn``, owns an ``nn.Dropout`` and deletes the
projected tensors when done. Annotated's module builds its four projections
with ``clones(nn.Linear(d_model, d_model), 4)``; the course loads weights
into ``qkv`` (fused) and ``out``, so here the three input projections come
out of one Linear and the list comprehension zips over its chunks.

-1e9 is not -inf: a row whose keys are all masked would average every value
uniformly, so ``attention`` zeroes those rows, as the course asks.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    d_model = x.size(-1)
    if d_model % num_heads != 0:
        raise ValueError("d_model must be a multiple of the number of heads")
    d_k = d_model // num_heads
    return x.view(*x.shape[:-1], num_heads, d_k).transpose(-3, -2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    h, d_k = x.size(-3), x.size(-1)
    x = x.transpose(-3, -2).contiguous()
    return x.view(*x.shape[:-2], h * d_k)


def attention(query, key, value, mask=None, dropout=None):
    "Compute 'Scaled Dot Product Attention'"
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if mask is not None:
        # a query with no key left: zero weights instead of a uniform average
        p_attn = p_attn.masked_fill((mask == 0).all(dim=-1, keepdim=True), 0.0)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


def multi_head_attention(query, key, value, num_heads, w_q, w_k, w_v, w_o, mask=None):
    query, key, value = [
        (x @ w.t()).view(*x.shape[:-1], num_heads, -1).transpose(-3, -2)
        for w, x in zip((w_q, w_k, w_v), (query, key, value))
    ]
    x, _ = attention(query, key, value, mask=mask)
    x = x.transpose(-3, -2).contiguous()
    x = x.view(*x.shape[:-2], -1)
    return x @ w_o.t()


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, bias: bool = True, dropout: float = 0.0):
        "Take in model size and number of heads."
        super().__init__()
        assert d_model % num_heads == 0
        # We assume d_v always equals d_k
        self.d_k = d_model // num_heads
        self.h = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x, mask=None, need_weights=False):
        batch = x.shape[:-2]

        # 1) Do all the linear projections in batch from d_model => h x d_k
        query, key, value = [
            t.view(*batch, -1, self.h, self.d_k).transpose(-3, -2)
            for t in self.qkv(x).chunk(3, dim=-1)
        ]

        # 2) Apply attention on all the projected vectors in batch.
        x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)

        # 3) "Concat" using a view and apply a final linear.
        x = x.transpose(-3, -2).contiguous().view(*batch, -1, self.h * self.d_k)
        del query
        del key
        del value
        x = self.out(x)
        return (x, self.attn) if need_weights else x


def torch_multihead_forward(query, key, value, num_heads, in_proj_weight, in_proj_bias,
                            out_proj_weight, out_proj_bias, key_padding_mask=None,
                            batch_first=False):
    if not batch_first:  # nn.MultiheadAttention's default layout is (seq, batch, feature)
        query, key, value = [t.transpose(0, 1) for t in (query, key, value)]
    biases = in_proj_bias.chunk(3) if in_proj_bias is not None else [None] * 3
    query, key, value = [
        F.linear(x, w, b).view(x.size(0), -1, num_heads, x.size(-1) // num_heads).transpose(1, 2)
        for w, b, x in zip(in_proj_weight.chunk(3), biases, (query, key, value))
    ]
    mask = None
    if key_padding_mask is not None:
        mask = (key_padding_mask == 0).unsqueeze(1).unsqueeze(1)  # (N, 1, 1, S), 1 = keep
    x, _ = attention(query, key, value, mask=mask)
    nbatches = x.size(0)
    x = x.transpose(1, 2).contiguous().view(nbatches, -1, num_heads * x.size(-1))
    x = F.linear(x, out_proj_weight, out_proj_bias)
    return x if batch_first else x.transpose(0, 1)


def parameter_count(d_model: int, num_heads: int, bias: bool = True) -> int:
    linear = d_model * d_model + (d_model if bias else 0)  # one nn.Linear(d_model, d_model)
    return 4 * linear  # what clones(nn.Linear(d_model, d_model), 4) would hold
