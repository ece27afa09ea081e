"""Chapter 6 in the style of Meta's LLaMA reference code (model.py).

``repeat_kv`` is ``torch.repeat_interleave(x, dim=..., repeats=n_rep)``;
the module projects to Meta's ``(bsz, seqlen, n_heads, head_dim)`` layout
before transposing; scores get ``-inf`` where masked and the softmax runs in
float32, ``F.softmax(scores.float(), dim=-1).type_as(xq)``; the ``nan`` that
softmax gives a row with no key left is turned into zeros. The bytes of a
number come from ``finfo``/``iinfo`` bits.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def expand_kv_heads(kv: torch.Tensor, num_query_heads: int) -> torch.Tensor:
    n_kv_heads = kv.shape[1]
    if num_query_heads % n_kv_heads != 0:
        raise ValueError(f"n_heads={num_query_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    n_rep = num_query_heads // n_kv_heads
    return torch.repeat_interleave(kv, dim=1, repeats=n_rep)  # (B, H_q, S, d)


def grouped_query_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    n_heads, head_dim = q.shape[1], q.shape[-1]
    keys = expand_kv_heads(k, n_heads)  # (bs, n_heads, cache_len, head_dim)
    values = expand_kv_heads(v, n_heads)
    scores = torch.matmul(q, keys.transpose(2, 3)) / math.sqrt(head_dim)  # (bs, n_heads, seqlen, cache_len)
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    scores = F.softmax(scores.float(), dim=-1).type_as(q)
    # exp(-inf - (-inf)) is nan: a query with every key masked attends to nothing
    scores = torch.nan_to_num(scores, nan=0.0)
    output = torch.matmul(scores, values)  # (bs, n_heads, seqlen, head_dim)
    return output, scores


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError("dim must be divisible by n_heads")
        if num_heads % num_kv_heads != 0:
            raise ValueError("n_heads must be divisible by n_kv_heads")
        self.n_heads = num_heads
        self.n_kv_heads = num_kv_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(self.n_heads * self.head_dim, d_model, bias=bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.q_proj(x), self.k_proj(x), self.v_proj(x)

        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_kv_heads, self.head_dim)

        xq = xq.transpose(1, 2)  # (bs, n_heads, seqlen, head_dim)
        keys = xk.transpose(1, 2)  # (bs, n_kv_heads, seqlen, head_dim)
        values = xv.transpose(1, 2)
        output, _ = grouped_query_attention(xq, keys, values, mask)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.out_proj(output)


def kv_cache_bytes(
    batch: int,
    seq_len: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> int:
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    bytes_per_number = info.bits // 8
    cache_k = batch * seq_len * num_kv_heads * head_dim  # Meta's cache_k: (max_batch, max_seq, n_kv, head_dim)
    cache_v = batch * seq_len * num_kv_heads * head_dim
    return num_layers * (cache_k + cache_v) * bytes_per_number
