"""Chapter 6 with einsum and an explicit group dimension, the way a
memory-minded student writes GQA: the K/V heads are never copied. Query
heads are viewed as ``(B, H_kv, group, L, d)`` and contracted with the
``(B, H_kv, S, d)`` keys in one einsum; the softmax is ``exp(scores -
logsumexp)``, with an empty row's ``-inf`` log-sum-exp replaced so that it
gives zeros. ``expand_kv_heads`` gathers head ``h // group`` with
``index_select``; the module's projections and output are einsums with the
``nn.Linear`` weights.
"""

import math

import torch
from torch import nn


def _group_size(num_query_heads: int, num_kv_heads: int) -> int:
    if num_query_heads % num_kv_heads:
        raise ValueError(f"{num_query_heads} query heads cannot be grouped over {num_kv_heads} K/V heads")
    return num_query_heads // num_kv_heads


def expand_kv_heads(kv: torch.Tensor, num_query_heads: int) -> torch.Tensor:
    group = _group_size(num_query_heads, kv.shape[1])
    source = torch.arange(num_query_heads, device=kv.device) // group  # K/V head of each query head
    return kv.index_select(1, source)  # (B, H_q, S, d)


def grouped_query_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, H_q, L, d = q.shape
    H_kv, S = k.shape[1], k.shape[2]
    g = _group_size(H_q, H_kv)
    # query head h = j * g + i is member i of group j: a view, no copy
    qg = q.reshape(B, H_kv, g, L, d)
    scores = torch.einsum("bjgld,bjsd->bjgls", qg, k) / math.sqrt(d)  # (B, H_kv, g, L, S)
    if mask is not None:
        mask = torch.broadcast_to(mask, (B, H_q, L, S)).reshape(B, H_kv, g, L, S)
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # (B, H_kv, g, L, 1)
    # a row with no key has lse = -inf; any finite value there makes every exp 0
    lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    weights = torch.exp(scores - lse)  # (B, H_kv, g, L, S)
    out = torch.einsum("bjgls,bjse->bjgle", weights, v)  # (B, H_kv, g, L, d_v)
    return out.reshape(B, H_q, L, v.shape[-1]), weights.reshape(B, H_q, L, S)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of num_heads {num_heads}")
        _group_size(num_heads, num_kv_heads)
        self.h_q, self.h_kv, self.d_head = num_heads, num_kv_heads, d_model // num_heads
        self.q_proj = nn.Linear(d_model, num_heads * self.d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.d_head, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.d_head, d_model, bias=bias)

    def _heads(self, proj: nn.Linear, x: torch.Tensor, heads: int) -> torch.Tensor:
        """(B, heads, T, d): the projection, one d-wide block of its output per head."""
        w = proj.weight.view(heads, self.d_head, -1)  # (heads, d, D)
        y = torch.einsum("btm,hdm->bhtd", x, w)
        if proj.bias is not None:
            y = y + proj.bias.view(heads, 1, self.d_head)
        return y

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        q = self._heads(self.q_proj, x, self.h_q)  # (B, H_q, T, d)
        k = self._heads(self.k_proj, x, self.h_kv)  # (B, H_kv, T, d)
        v = self._heads(self.v_proj, x, self.h_kv)
        heads, _ = grouped_query_attention(q, k, v, mask)  # (B, H_q, T, d)
        w_o = self.out_proj.weight.view(-1, self.h_q, self.d_head)  # (D, H_q, d)
        y = torch.einsum("bhtd,mhd->btm", heads, w_o)
        if self.out_proj.bias is not None:
            y = y + self.out_proj.bias
        return y


def kv_cache_bytes(
    batch: int,
    seq_len: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> int:
    # K and V for each layer, sequence, token, K/V head and feature
    return math.prod((2, num_layers, batch, seq_len, num_kv_heads, head_dim)) * dtype.itemsize
