"""Chapter 6 written with plain loops over the query heads, as a student does
before trusting broadcasting: query head ``h`` looks up K/V head
``h // group`` by hand, its scores and softmax are computed in float64 and
the answer is cast back; the module projects each head with its own slice
of the weights (``F.linear`` on rows ``h*d .. (h+1)*d``); the cache size is
added up layer by layer.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def expand_kv_heads(kv: torch.Tensor, num_query_heads: int) -> torch.Tensor:
    num_kv_heads = kv.shape[1]
    if num_query_heads % num_kv_heads != 0:
        raise ValueError("the number of query heads must be a multiple of the number of K/V heads")
    group = num_query_heads // num_kv_heads
    heads = []
    for h in range(num_query_heads):
        heads.append(kv[:, h // group])  # (B, S, d)
    return torch.stack(heads, dim=1)  # (B, H_q, S, d)


def _one_head(q_h, k_h, v_h, mask_h):
    """Attention of one head in float64: (B, L, d), (B, S, d), (B, S, d_v), (B, L, S) or None."""
    d = q_h.shape[-1]
    scores = q_h.double() @ k_h.double().transpose(-2, -1) / math.sqrt(d)  # (B, L, S)
    if mask_h is not None:
        scores = scores.masked_fill(~mask_h, float("-inf"))
    has_key = ~torch.isinf(scores).all(dim=-1, keepdim=True)  # (B, L, 1)
    weights = torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1) * has_key  # zeros for a row with no key
    out = weights @ v_h.double()  # (B, L, d_v)
    return out.to(q_h.dtype), weights.to(q_h.dtype)


def grouped_query_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, num_query_heads, length, _ = q.shape
    num_kv_heads, keys = k.shape[1], k.shape[2]
    if num_query_heads % num_kv_heads != 0:
        raise ValueError("the number of query heads must be a multiple of the number of K/V heads")
    group = num_query_heads // num_kv_heads
    if mask is not None:
        mask = mask.expand(batch, num_query_heads, length, keys)  # one (L, S) matrix per query head
    outputs, all_weights = [], []
    for h in range(num_query_heads):
        kv_head = h // group
        out, weights = _one_head(q[:, h], k[:, kv_head], v[:, kv_head],
                                 None if mask is None else mask[:, h])
        outputs.append(out)
        all_weights.append(weights)
    return torch.stack(outputs, dim=1), torch.stack(all_weights, dim=1)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError("d_model must be divisible by num_heads")
        if num_heads % num_kv_heads != 0:
            raise ValueError("num_heads must be divisible by num_kv_heads")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias)

    def _project_head(self, proj: nn.Linear, x: torch.Tensor, head: int) -> torch.Tensor:
        rows = slice(head * self.head_dim, (head + 1) * self.head_dim)
        bias = None if proj.bias is None else proj.bias[rows]
        return F.linear(x, proj.weight[rows], bias)  # (B, T, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, length, _ = x.shape
        group = self.num_heads // self.num_kv_heads
        if mask is not None:
            mask = mask.expand(batch, self.num_heads, length, length)
        keys = [self._project_head(self.k_proj, x, j) for j in range(self.num_kv_heads)]
        values = [self._project_head(self.v_proj, x, j) for j in range(self.num_kv_heads)]
        heads = []
        for h in range(self.num_heads):
            q_h = self._project_head(self.q_proj, x, h)
            out, _ = _one_head(q_h, keys[h // group], values[h // group], None if mask is None else mask[:, h])
            heads.append(out)  # (B, T, d)
        return self.out_proj(torch.cat(heads, dim=-1))  # (B, T, H_q * d) -> (B, T, D)


def kv_cache_bytes(
    batch: int,
    seq_len: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> int:
    bytes_per_number = torch.zeros((), dtype=dtype).element_size()
    total = 0
    for _ in range(num_layers):
        for _ in ("keys", "values"):
            total += batch * seq_len * num_kv_heads * head_dim * bytes_per_number
    return total
