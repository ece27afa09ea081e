"""Chapter 5 as a linear-algebra student writes it (the CS336 way of thinking
about RoPE): every token gets a block-diagonal ``d x d`` rotation matrix,
built by scattering cos and sin into it, and vectors are turned with
``torch.einsum``; the attention is einsum from projection to output.
"""

import math

import torch


def rope_angles(token_positions: torch.Tensor, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    if head_dim % 2 != 0:
        raise ValueError(f"cannot rotate an odd number of features ({head_dim})")
    k = torch.arange(head_dim // 2, device=token_positions.device)
    inv_freq = torch.pow(theta, -2.0 * k / head_dim).float()  # (d/2,)
    return torch.einsum("...t,k->...tk", token_positions.float(), inv_freq)


def _rotation_matrices(angles: torch.Tensor, first: torch.Tensor, second: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
    """(..., T, d, d): pair k, features (first[k], second[k]), turned by angles[..., k]."""
    d = 2 * angles.shape[-1]
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    R = torch.zeros(*angles.shape[:-1], d, d, dtype=dtype, device=angles.device)
    R[..., first, first] = cos
    R[..., first, second] = -sin
    R[..., second, first] = sin
    R[..., second, second] = cos
    return R


def _rotate(x: torch.Tensor, token_positions: torch.Tensor, theta: float, first, second) -> torch.Tensor:
    # float32 for float16/bfloat16/float32 inputs, float64 for float64 ones
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    angles = rope_angles(token_positions, x.shape[-1], theta)  # (..., T, d/2)
    R = _rotation_matrices(angles, first, second, compute)  # (..., T, d, d)
    return torch.einsum("...ij,...j->...i", R, x.to(compute)).to(x.dtype)


def apply_rope(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    d = x.shape[-1]
    first = torch.arange(0, d, 2, device=x.device)  # 0, 2, 4, ...
    return _rotate(x, token_positions, theta, first, first + 1)


def apply_rope_half(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    d = x.shape[-1]
    first = torch.arange(d // 2, device=x.device)  # 0, 1, ..., d/2 - 1
    return _rotate(x, token_positions, theta, first, first + d // 2)


def adjacent_to_half_permutation(head_dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    # (d/2, 2) grid of pairs read column by column
    return torch.arange(head_dim, device=device).unflatten(0, (-1, 2)).mT.flatten()


def rope_self_attention(
    d_model: int,
    num_heads: int,
    max_seq_len: int,
    theta: float,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    x: torch.Tensor,
    token_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    seq = x.shape[-2]
    d_k = d_model // num_heads
    if token_positions is None:
        token_positions = torch.arange(seq, device=x.device)
    if (token_positions >= max_seq_len).any():
        raise ValueError("token position out of range")

    def project(w):  # (..., H, T, d_k): the output features of head h are h*d_k .. (h+1)*d_k
        return torch.einsum("...td,hkd->...htk", x, w.view(num_heads, d_k, d_model))

    q, k, v = project(w_q), project(w_k), project(w_v)
    positions = token_positions[..., None, :]  # (..., 1, T): the same for every head
    q, k = apply_rope(q, positions, theta), apply_rope(k, positions, theta)
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(d_k)  # (..., H, T, T)
    causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=x.device))
    weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    heads = torch.einsum("...qk,...kd->...qd", weights, v)  # (..., H, T, d_k)
    return torch.einsum("...htk,mhk->...tm", heads, w_o.view(d_model, num_heads, d_k))
