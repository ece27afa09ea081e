"""Chapter 7 written in the loop order of FlashAttention-2 (Dao, 2023, Algorithm 1).

The outer loop takes one block of queries at a time and runs the whole online
softmax over the key blocks for it; the output accumulator stays unnormalised
until the last key block, and the division by the running sum happens once.
With causal=True the inner loop stops at the last key block the block's last
query can see, and only the blocks on the diagonal get a mask (torch.where).
"""

import torch

NEG_INF = float("-inf")


def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    row_max = torch.full_like(x[..., 0], NEG_INF)  # (...,)
    row_sum = torch.zeros_like(x[..., 0])  # (...,)
    for chunk in x.split(block_size, dim=-1):  # (..., <= block_size)
        new_max = torch.maximum(row_max, chunk.amax(dim=-1))
        row_sum = row_sum * (row_max - new_max).exp() + (chunk - new_max.unsqueeze(-1)).exp().sum(dim=-1)
        row_max = new_max
    return (x - row_max.unsqueeze(-1)).exp() / row_sum.unsqueeze(-1)


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int,
                    causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5
    offset = n_k - n_q  # bottom-right: query i sees keys 0 .. i + offset
    out_blocks, lse_blocks = [], []
    for q_lo in range(0, n_q, block_size):  # outer loop: blocks of queries
        q_hi = min(q_lo + block_size, n_q)
        q_blk = q[..., q_lo:q_hi, :]  # (..., Br, d)
        m_i = q.new_full((*q_blk.shape[:-1], 1), NEG_INF)  # (..., Br, 1)
        l_i = q.new_zeros(*q_blk.shape[:-1], 1)  # (..., Br, 1)
        acc = q.new_zeros(*q_blk.shape[:-1], v.shape[-1])  # (..., Br, d_v)
        # the last key the last query of this block may see
        k_end = min(n_k, q_hi - 1 + offset + 1) if causal else n_k
        for k_lo in range(0, max(k_end, 0), block_size):  # inner loop: blocks of keys
            k_hi = min(k_lo + block_size, n_k)
            s = (q_blk @ k[..., k_lo:k_hi, :].transpose(-2, -1)) * scale  # (..., Br, Bc)
            if causal and k_hi - 1 > q_lo + offset:  # the block crosses the diagonal
                pos_q = torch.arange(q_lo, q_hi, device=q.device).view(-1, 1) + offset  # (Br, 1)
                pos_k = torch.arange(k_lo, k_hi, device=q.device).view(1, -1)  # (1, Bc)
                s = torch.where(pos_k <= pos_q, s, torch.full_like(s, NEG_INF))
            m_new = torch.maximum(m_i, s.amax(dim=-1, keepdim=True))  # (..., Br, 1)
            m_use = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - m_use)  # (..., Br, Bc)
            correction = torch.exp(m_i - m_use)  # (..., Br, 1)
            l_i = correction * l_i + p.sum(dim=-1, keepdim=True)
            acc = correction * acc + p @ v[..., k_lo:k_hi, :]
            m_i = m_new
        # queries that saw no key at all (L > S, causal): l = 0, acc = 0 -> output 0
        out_blocks.append(acc / torch.where(l_i > 0, l_i, torch.ones_like(l_i)))
        lse_blocks.append(m_i + torch.log(l_i))  # the paper's L_i = m_i + log(l_i), kept for the backward
    return torch.cat(out_blocks, dim=-2), torch.cat(lse_blocks, dim=-2).squeeze(-1)  # (..., L, d_v), (..., L)


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                    lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # A's share of the mass is e^a / (e^a + e^b) = sigmoid(a - b); -inf - b gives share 0.
    share_a = torch.sigmoid(lse_a - lse_b)
    share_b = torch.sigmoid(lse_b - lse_a)
    big = torch.maximum(lse_a, lse_b)
    lse = big + torch.log1p(torch.exp(-(lse_a - lse_b).abs()))  # log(e^a + e^b)
    out = share_a[..., None] * out_a + share_b[..., None] * out_b
    return out, lse
