"""Chapter 9 in FlashAttention-2's loop orders (Dao, 2023, Algorithms 1 and 2), as the Triton tutorial writes them.

Forward: blocks of queries outside, an online softmax over blocks of keys
inside, the division by the running sum once at the end, and the
log-sum-exp L_i = m_i + log(l_i) kept for backward. Backward: blocks of keys
outside, holding that block's dK and dV, blocks of queries inside, each
adding its dQ into the whole. D = rowsum(dO * O) is computed first, in its
own pass, as the tutorial's _attn_bwd_preprocess does. Raw scores q . k are
kept and the scale applied with the exponent, as in the kernels.
"""

import math

import torch


def _visible(q_start, q_len, k_start, k_len, offset, device):
    rows = torch.arange(q_start, q_start + q_len, device=device)[:, None] + offset  # (Bq, 1)
    cols = torch.arange(k_start, k_start + k_len, device=device)[None, :]  # (1, Bk)
    return cols <= rows  # (Bq, Bk)


def flash_attention_forward(q, k, v, causal=False, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    sm_scale = 1.0 / math.sqrt(q.shape[-1])
    outs, lses = [], []
    for q_start in range(0, n_q, block_size):
        q_i = q[..., q_start:q_start + block_size, :]
        m_i = torch.full(q_i.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        l_i = torch.zeros_like(m_i)
        acc = torch.zeros(*q_i.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        for k_start in range(0, n_k, block_size):
            k_j, v_j = k[..., k_start:k_start + block_size, :], v[..., k_start:k_start + block_size, :]
            qk = q_i @ k_j.transpose(-1, -2)  # raw scores (..., Bq, Bk)
            if causal:
                mask = _visible(q_start, q_i.shape[-2], k_start, k_j.shape[-2], n_k - n_q, q.device)
                qk = qk.masked_fill(~mask, float("-inf"))
            m_ij = torch.maximum(m_i, qk.amax(-1) * sm_scale)
            m_safe = torch.where(m_ij == float("-inf"), torch.zeros_like(m_ij), m_ij)
            p = torch.exp(qk * sm_scale - m_safe[..., None])
            alpha = torch.exp(m_i - m_safe)
            l_i = l_i * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + p @ v_j
            m_i = m_ij
        outs.append(acc / torch.where(l_i == 0, torch.ones_like(l_i), l_i)[..., None])
        lses.append(m_i + torch.log(l_i))
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)


def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_size=64):
    n_q, n_k = q.shape[-2], k.shape[-2]
    sm_scale = 1.0 / math.sqrt(q.shape[-1])
    delta = (out * grad_out).sum(-1)  # _attn_bwd_preprocess: (..., L)
    dq = torch.zeros_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    for k_start in range(0, n_k, block_size):
        k_j, v_j = k[..., k_start:k_start + block_size, :], v[..., k_start:k_start + block_size, :]
        dk_j = torch.zeros_like(k_j)
        dv_j = torch.zeros_like(v_j)
        for q_start in range(0, n_q, block_size):
            rows = slice(q_start, q_start + block_size)
            q_i, do_i = q[..., rows, :], grad_out[..., rows, :]
            lse_i, delta_i = lse[..., rows], delta[..., rows]
            qk = q_i @ k_j.transpose(-1, -2)
            if causal:
                mask = _visible(q_start, q_i.shape[-2], k_start, k_j.shape[-2], n_k - n_q, q.device)
                qk = qk.masked_fill(~mask, float("-inf"))
            lse_safe = torch.where(torch.isinf(lse_i), torch.full_like(lse_i, float("inf")), lse_i)
            p = torch.exp(qk * sm_scale - lse_safe[..., None])  # (..., Bq, Bk)
            dv_j += p.transpose(-1, -2) @ do_i
            dp = do_i @ v_j.transpose(-1, -2)
            ds = p * (dp - delta_i[..., None])
            dk_j += ds.transpose(-1, -2) @ q_i * sm_scale
            dq[..., rows, :] += ds @ k_j * sm_scale
        dk[..., k_start:k_start + block_size, :] = dk_j
        dv[..., k_start:k_start + block_size, :] = dv_j
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_size=64):
        o, M = flash_attention_forward(q, k, v, causal=causal, block_size=block_size)
        ctx.save_for_backward(q, k, v, o, M)
        ctx.causal, ctx.BLOCK = causal, block_size
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, M = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, M, do, causal=ctx.causal, block_size=ctx.BLOCK)
        return dq, dk, dv, None, None


def flash_attention(q, k, v, causal=False, block_size=64):
    return FlashAttentionFunction.apply(q, k, v, causal, block_size)


def flash_attention_gradients(q, k, v, grad_out, causal=False, block_size=64):
    q, k, v = (tensor.detach().requires_grad_(True) for tensor in (q, k, v))
    out = flash_attention(q, k, v, causal, block_size)
    grads = torch.autograd.grad((out * grad_out).sum(), (q, k, v), allow_unused=True)
    return (out.detach(), *grads)


def saved_for_backward(q, k, v, causal=False, block_size=64):
    shapes = []

    def pack(tensor):
        shapes.append(tuple(tensor.shape))
        return tensor

    q, k, v = (tensor.detach().requires_grad_(True) for tensor in (q, k, v))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        flash_attention(q, k, v, causal, block_size)
    return shapes
