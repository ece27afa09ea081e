"""Chapter 9 as Stanford CS336's assignment 2 has students write FlashAttention-2 in PyTorch.

The forward is a tiled loop over query tiles and key tiles (B_q = B_k =
block_size) that keeps the row max m and the sum l, then returns
O = diag(l)^-1 O~ and L = m + log l; the backward recomputes
P = exp(S - L) tile by tile with D = rowsum(O * dO), written with
torch.logsumexp-free plain ops. Bookkeeping with float32 inside, as the
assignment's handout does for bf16 inputs, cast back at the end; the
autograd.Function saves Q, K, V, O and L and stores the flags on ctx.
"""

import math

import torch


def _mask_tile(S, i0, j0, n_q, n_k, causal):
    if not causal:
        return S
    q_idx = torch.arange(i0, i0 + S.shape[-2], device=S.device).unsqueeze(1) + (n_k - n_q)
    k_idx = torch.arange(j0, j0 + S.shape[-1], device=S.device).unsqueeze(0)
    return S.masked_fill(k_idx > q_idx, -float("inf"))


def flash_attention_forward(q, k, v, causal=False, block_size=64):
    Q, K, V = q.float(), k.float(), v.float()
    n_q, n_k = Q.shape[-2], K.shape[-2]
    scale = Q.shape[-1] ** -0.5
    O_tiles, L_tiles = [], []
    for i in range(math.ceil(n_q / block_size)):
        Q_i = Q[..., i * block_size:(i + 1) * block_size, :]
        O_i = Q_i.new_zeros(*Q_i.shape[:-1], V.shape[-1])
        l_i = Q_i.new_zeros(Q_i.shape[:-1])
        m_i = Q_i.new_full(Q_i.shape[:-1], -float("inf"))
        for j in range(math.ceil(n_k / block_size)):
            K_j = K[..., j * block_size:(j + 1) * block_size, :]
            V_j = V[..., j * block_size:(j + 1) * block_size, :]
            S_ij = _mask_tile(Q_i @ K_j.transpose(-2, -1) * scale, i * block_size, j * block_size, n_q, n_k, causal)
            m_new = torch.max(m_i, S_ij.max(dim=-1).values)
            m_use = m_new.nan_to_num(neginf=0.0)
            P_ij = torch.exp(S_ij - m_use.unsqueeze(-1))
            l_i = torch.exp(m_i - m_use) * l_i + P_ij.sum(dim=-1)
            O_i = torch.exp(m_i - m_use).unsqueeze(-1) * O_i + P_ij @ V_j
            m_i = m_new
        O_tiles.append(O_i / l_i.clamp_min(1e-30).unsqueeze(-1))
        L_tiles.append(m_i + torch.log(l_i))
    return torch.cat(O_tiles, dim=-2).to(q.dtype), torch.cat(L_tiles, dim=-1).to(q.dtype)


def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_size=64):
    Q, K, V, O, L, dO = (t.float() for t in (q, k, v, out, lse, grad_out))
    n_q, n_k = Q.shape[-2], K.shape[-2]
    scale = Q.shape[-1] ** -0.5
    D = (O * dO).sum(dim=-1)  # (..., n_q)
    L = L.masked_fill(L == -float("inf"), float("inf"))
    dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)
    for j in range(math.ceil(n_k / block_size)):
        cols = slice(j * block_size, (j + 1) * block_size)
        K_j, V_j = K[..., cols, :], V[..., cols, :]
        for i in range(math.ceil(n_q / block_size)):
            rows = slice(i * block_size, (i + 1) * block_size)
            S_ij = _mask_tile(Q[..., rows, :] @ K_j.transpose(-2, -1) * scale, i * block_size, j * block_size,
                              n_q, n_k, causal)
            P_ij = torch.exp(S_ij - L[..., rows].unsqueeze(-1))
            dV[..., cols, :] += P_ij.transpose(-2, -1) @ dO[..., rows, :]
            dP_ij = dO[..., rows, :] @ V_j.transpose(-2, -1)
            dS_ij = P_ij * (dP_ij - D[..., rows].unsqueeze(-1)) * scale
            dQ[..., rows, :] += dS_ij @ K_j
            dK[..., cols, :] += dS_ij.transpose(-2, -1) @ Q[..., rows, :]
    return dQ.to(q.dtype), dK.to(k.dtype), dV.to(v.dtype)


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False, block_size=64):
        O, L = flash_attention_forward(Q, K, V, is_causal, block_size)
        ctx.save_for_backward(Q, K, V, O, L)
        ctx.is_causal = is_causal
        ctx.block_size = block_size
        return O

    @staticmethod
    def backward(ctx, dO):
        Q, K, V, O, L = ctx.saved_tensors
        dQ, dK, dV = flash_attention_backward(Q, K, V, O, L, dO, ctx.is_causal, ctx.block_size)
        return dQ, dK, dV, None, None


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
