"""Chapter 7 with log-sum-exps instead of a running max and sum.

Each row carries one number, lse = log(sum of exp(score)) over what it has read so
far, and merges a new block in with torch.logaddexp(lse, torch.logsumexp(block)).
Tiled attention keeps its output normalised against the current lse, so that each
key block is folded in exactly as merge_attention folds two parts together:
split-KV attention (Flash-Decoding) done one block at a time.
"""

import math

import torch


def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    lse = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)  # (...,)
    for start in range(0, x.size(-1), block_size):
        block_lse = torch.logsumexp(x[..., start:start + block_size], dim=-1)  # (...,)
        lse = torch.logaddexp(lse, block_lse)
    return torch.exp(x - lse.unsqueeze(-1))  # (..., N)


def _fold(out, lse, block_out, block_lse):
    """Merge a block's (normalised output, lse) into the running pair; either lse may be -inf."""
    new_lse = torch.logaddexp(lse, block_lse)  # (..., L)
    # A query that has seen no visible key yet: both -inf. Measure from 0 there, so that the
    # weights are exp(-inf) = 0 and not exp(-inf + inf) = NaN.
    ref = new_lse.masked_fill(new_lse == -math.inf, 0.0)
    old_weight = torch.exp(lse - ref).unsqueeze(-1)  # (..., L, 1)
    block_weight = torch.exp(block_lse - ref).unsqueeze(-1)
    return old_weight * out + block_weight * block_out, new_lse


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int,
                    causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    length_q, length_k = q.size(-2), k.size(-2)
    scale = 1 / math.sqrt(q.size(-1))
    out = q.new_zeros(*q.shape[:-1], v.size(-1))  # (..., L, d_v), normalised so far
    lse = q.new_full(q.shape[:-1], -math.inf)  # (..., L)
    query_pos = torch.arange(length_q, device=q.device).unsqueeze(1) + (length_k - length_q)  # (L, 1)
    for start in range(0, length_k, block_size):
        stop = min(start + block_size, length_k)
        scores = torch.matmul(q, k[..., start:stop, :].transpose(-1, -2)) * scale  # (..., L, block)
        if causal:
            key_pos = torch.arange(start, stop, device=q.device)  # (block,)
            scores = scores.masked_fill(key_pos > query_pos, -math.inf)
        block_lse = torch.logsumexp(scores, dim=-1)  # (..., L), -inf for a fully masked row
        safe = block_lse.masked_fill(block_lse == -math.inf, 0.0).unsqueeze(-1)
        block_out = torch.matmul(torch.exp(scores - safe), v[..., start:stop, :])  # (..., L, d_v)
        out, lse = _fold(out, lse, block_out, block_lse)
    return out, lse  # a query with no visible key kept its zeros and lse -inf


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                    lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lse = torch.logsumexp(torch.stack([lse_a, lse_b]), dim=0)  # (..., L)
    out = torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[..., None] * out_b
    return out, lse
