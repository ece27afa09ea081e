"""Chapter 7 the way Llama-style inference code treats precision: whatever dtype comes in
(bfloat16, float16, float32, float64), the softmax statistics and the accumulator are
kept in float32 (`.float()`), and the result is cast back with `.type_as(...)`.

The causal mask of each key block is Llama's additive one: a (L, block) tensor of
-inf made with torch.full, cut with torch.triu at the right diagonal, added to the
scores.
"""

import math

import torch


def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    xf = x.float()  # statistics in float32, whatever x is
    seqlen = xf.shape[-1]
    running_max = torch.full(xf.shape[:-1], float("-inf"), device=x.device)  # (...,) float32
    running_sum = torch.zeros(xf.shape[:-1], device=x.device)  # (...,) float32
    for start_pos in range(0, seqlen, block_size):
        chunk = xf[..., start_pos:start_pos + block_size]
        chunk_max = torch.max(chunk, dim=-1).values
        new_max = torch.maximum(running_max, chunk_max)
        running_sum = running_sum * torch.exp(running_max - new_max) + torch.sum(
            torch.exp(chunk - new_max[..., None]), dim=-1
        )
        running_max = new_max
    probs = torch.exp(xf - running_max[..., None]) / running_sum[..., None]
    return probs.type_as(x)


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int,
                    causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    xq, xk, xv = q.float(), k.float(), v.float()
    seqlen_q, seqlen_k = xq.shape[-2], xk.shape[-2]
    head_dim = xq.shape[-1]
    start_pos = seqlen_k - seqlen_q  # where the queries start among the keys (bottom-right)

    m = torch.full((*xq.shape[:-1], 1), float("-inf"), device=q.device)  # (..., L, 1)
    l = torch.zeros((*xq.shape[:-1], 1), device=q.device)  # (..., L, 1)
    acc = torch.zeros((*xq.shape[:-1], xv.shape[-1]), device=q.device)  # (..., L, d_v)
    for kv_start in range(0, seqlen_k, block_size):
        keys = xk[..., kv_start:kv_start + block_size, :]  # (..., block, d)
        values = xv[..., kv_start:kv_start + block_size, :]  # (..., block, d_v)
        scores = torch.matmul(xq, keys.transpose(-2, -1)) / math.sqrt(head_dim)  # (..., L, block)
        if causal:
            # query i (position i + start_pos) may not see key kv_start + c when
            # kv_start + c > i + start_pos, i.e. c - i >= start_pos + 1 - kv_start
            mask = torch.full((seqlen_q, keys.shape[-2]), float("-inf"), device=q.device)
            mask = torch.triu(mask, diagonal=start_pos + 1 - kv_start)  # (L, block): 0 or -inf
            scores = scores + mask
        new_m = torch.maximum(m, scores.max(dim=-1, keepdim=True).values)
        # rows that have not seen a visible key yet stay at -inf: subtract 0 there
        safe_m = torch.where(new_m == float("-inf"), torch.zeros_like(new_m), new_m)
        p = torch.exp(scores - safe_m)
        alpha = torch.exp(m - safe_m)
        l = alpha * l + p.sum(dim=-1, keepdim=True)
        acc = alpha * acc + torch.matmul(p, values)
        m = new_m
    out = acc / torch.where(l == 0, torch.ones_like(l), l)
    lse = (m + torch.log(l)).squeeze(-1)  # float32, like the statistics it comes from
    return out.type_as(q), lse.type_as(q)


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                    lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lse = torch.logaddexp(lse_a.float(), lse_b.float())
    scale_a = torch.exp(lse_a.float() - lse).unsqueeze(-1)
    scale_b = torch.exp(lse_b.float() - lse).unsqueeze(-1)
    out = scale_a * out_a.float() + scale_b * out_b.float()
    return out.type_as(out_a), lse.type_as(lse_a)
