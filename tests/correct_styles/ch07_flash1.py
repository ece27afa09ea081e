"""Chapter 7 written in the loop order of the first FlashAttention paper (Algorithm 1).

The outer loop walks the blocks of keys and values, the inner loop the blocks of
queries. Each query block owns its output O_i and its statistics m_i and l_i,
kept in Python lists (the paper's "HBM"): they are read, updated and written back
every time a new key block comes by. As in the paper, O_i is kept normalised after
every step (divided by the running sum), not only at the end.
"""

import math

import torch


def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    n = x.shape[-1]
    rows = x.reshape(-1, n)  # (R, N): every leading dimension is just more rows
    m = rows.new_full((rows.shape[0],), -math.inf)  # (R,)
    l = rows.new_zeros(rows.shape[0])  # (R,)
    num_blocks = math.ceil(n / block_size)
    for j in range(num_blocks):
        x_j = rows[:, j * block_size:(j + 1) * block_size]  # (R, B_c)
        m_tilde = x_j.max(dim=-1).values  # (R,)
        m_new = torch.max(m, m_tilde)
        # exp(m - m_new) <= 1 corrects the old sum; -inf on the first block gives 0
        l = torch.exp(m - m_new) * l + torch.exp(x_j - m_new[:, None]).sum(dim=-1)
        m = m_new
    p = torch.exp(rows - m[:, None]) / l[:, None]  # (R, N)
    return p.reshape(x.shape)


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int,
                    causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    L, S = q.shape[-2], k.shape[-2]
    d_v = v.shape[-1]
    softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    shift = S - L  # query i sits at position i + S - L (bottom-right)
    B_c = block_size  # keys per block
    B_r = block_size  # queries per block

    Q = list(q.split(B_r, dim=-2))  # T_r blocks (..., B_r, d)
    K = k.split(B_c, dim=-2)  # T_c blocks (..., B_c, d)
    V = v.split(B_c, dim=-2)  # T_c blocks (..., B_c, d_v)
    O = [q.new_zeros(*Q_i.shape[:-1], d_v) for Q_i in Q]  # (..., B_r, d_v) each
    l = [q.new_zeros(*Q_i.shape[:-1], 1) for Q_i in Q]  # (..., B_r, 1) each
    m = [q.new_full((*Q_i.shape[:-1], 1), -math.inf) for Q_i in Q]  # (..., B_r, 1) each

    for j in range(len(K)):  # outer loop: key/value blocks
        K_j, V_j = K[j], V[j]
        key_lo = j * B_c
        for i in range(len(Q)):  # inner loop: query blocks
            Q_i = Q[i]
            row_lo = i * B_r
            rows_i = Q_i.shape[-2]
            if causal and key_lo > row_lo + rows_i - 1 + shift:
                continue  # every key of this block is in the future of every query of this block
            S_ij = softmax_scale * (Q_i @ K_j.transpose(-1, -2))  # (..., B_r, B_c)
            if causal:
                rows = torch.arange(row_lo, row_lo + rows_i, device=q.device).unsqueeze(-1) + shift  # (B_r, 1)
                cols = torch.arange(key_lo, key_lo + K_j.shape[-2], device=q.device)  # (B_c,)
                S_ij = S_ij.masked_fill(cols > rows, -math.inf)
            m_tilde = S_ij.amax(dim=-1, keepdim=True)  # (..., B_r, 1), -inf for a row that sees nothing here
            m_tilde_safe = torch.where(m_tilde == -math.inf, torch.zeros_like(m_tilde), m_tilde)
            P_ij = torch.exp(S_ij - m_tilde_safe)  # (..., B_r, B_c)
            l_tilde = P_ij.sum(dim=-1, keepdim=True)  # (..., B_r, 1)

            m_new = torch.max(m[i], m_tilde)
            # A row that has seen no visible key yet still has m = -inf: measure from 0 so that
            # exp(-inf - (-inf)) does not make a NaN.
            m_ref = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m[i] - m_ref)  # old statistics to the new max
            beta = torch.exp(m_tilde - m_ref)  # this block's statistics to the new max
            l_new = alpha * l[i] + beta * l_tilde
            l_div = torch.where(l_new == 0, torch.ones_like(l_new), l_new)
            O[i] = (l[i] * alpha * O[i] + beta * (P_ij @ V_j)) / l_div  # written back normalised
            l[i] = l_new
            m[i] = m_new
    # The statistics left in "HBM" give each row's log-sum-exp: m + log l (-inf + log 0 = -inf
    # for a row that saw no visible key).
    lse = torch.cat([m_i + torch.log(l_i) for m_i, l_i in zip(m, l)], dim=-2)  # (..., L, 1)
    return torch.cat(O, dim=-2), lse.squeeze(-1)  # (..., L, d_v), (..., L)


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                    lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The same update as one step of the loop above, with (m, l) folded into lse = m + log l.
    m = torch.max(lse_a, lse_b)  # (..., L), finite: every query has a key somewhere
    w_a = torch.exp(lse_a - m)  # (..., L)
    w_b = torch.exp(lse_b - m)
    total = w_a + w_b
    out = (w_a.unsqueeze(-1) * out_a + w_b.unsqueeze(-1) * out_b) / total.unsqueeze(-1)
    return out, m + torch.log(total)
