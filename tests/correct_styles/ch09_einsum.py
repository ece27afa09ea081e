"""Chapter 9 with einsum, in FlashAttention-1's loop order (Dao et al., 2022, Algorithms 1 and 4).

The forward keeps the running max and sum as (..., L) vectors, updated one
block of keys at a time; the backward walks the key blocks too, rebuilding
each block's weights from the saved log-sum-exp and writing that block's
dK and dV whole, while dQ accumulates. The causal mask is a comparison of
broadcast positions, made per block.
"""

import math

import torch


def _block_scores(q, k_block, start, causal, offset, scale):
    scores = torch.einsum("...id,...jd->...ij", q, k_block) * scale  # (..., L, Bk)
    if causal:
        rows = torch.arange(q.shape[-2], device=q.device).unsqueeze(-1) + offset  # (L, 1)
        cols = torch.arange(start, start + k_block.shape[-2], device=q.device)  # (Bk,)
        scores = torch.where(cols <= rows, scores, torch.full_like(scores, -math.inf))
    return scores


def flash_attention_forward(q, k, v, causal=False, block_size=64):
    L, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    row_max = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)  # (..., L)
    row_sum = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)  # (..., L)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)  # (..., L, d_v)
    for start in range(0, S, block_size):
        k_block, v_block = k[..., start:start + block_size, :], v[..., start:start + block_size, :]
        scores = _block_scores(q, k_block, start, causal, S - L, scale)
        new_max = torch.maximum(row_max, scores.amax(dim=-1))
        safe = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
        weights = torch.exp(scores - safe.unsqueeze(-1))
        correction = torch.exp(row_max - safe)
        row_sum = correction * row_sum + weights.sum(dim=-1)
        acc = correction.unsqueeze(-1) * acc + torch.einsum("...ij,...jd->...id", weights, v_block)
        row_max = new_max
    out = acc / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum)).unsqueeze(-1)
    return out, row_max + torch.log(row_sum)


def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_size=64):
    L, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    delta = torch.einsum("...id,...id->...i", grad_out, out)  # (..., L)
    lse = torch.where(torch.isinf(lse), torch.full_like(lse, math.inf), lse)  # no key: weights 0
    dq, dk_blocks, dv_blocks = torch.zeros_like(q), [], []
    for start in range(0, S, block_size):
        k_block, v_block = k[..., start:start + block_size, :], v[..., start:start + block_size, :]
        weights = torch.exp(_block_scores(q, k_block, start, causal, S - L, scale) - lse.unsqueeze(-1))
        dv_blocks.append(torch.einsum("...ij,...id->...jd", weights, grad_out))
        d_weights = torch.einsum("...id,...jd->...ij", grad_out, v_block)
        d_scores = weights * (d_weights - delta.unsqueeze(-1)) * scale
        dq = dq + torch.einsum("...ij,...jd->...id", d_scores, k_block)
        dk_blocks.append(torch.einsum("...ij,...id->...jd", d_scores, q))
    return dq, torch.cat(dk_blocks, dim=-2), torch.cat(dv_blocks, dim=-2)


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_size=64):
        out, lse = flash_attention_forward(q, k, v, causal, block_size)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        ctx.block_size = block_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grads = flash_attention_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.block_size)
        return (*grads, None, None)


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
