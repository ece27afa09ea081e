"""Chapter 5 written the way Meta's LLaMA reference code does RoPE.

Adjacent pairs are read as complex numbers (``view_as_complex``) and turned by
multiplying with ``e^(i angle)`` made by ``torch.polar``; everything happens
in float32 (``x.float()``) and goes back with ``.type_as(x)``. The attention
keeps Meta's ``(B, T, H, d)`` layout for the rotation, precomputes a
``freqs_cis`` table for ``max_seq_len`` positions, adds a ``-inf`` upper
triangle to the scores and runs the softmax in float32.
"""

import math

import torch
import torch.nn.functional as F


def rope_angles(token_positions: torch.Tensor, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=token_positions.device)[: (head_dim // 2)].float()
                             / head_dim))  # (d/2,)
    t = token_positions.reshape(-1).float()  # (N,) every position, flattened
    angles = torch.outer(t, freqs)  # (N, d/2)
    return angles.view(*token_positions.shape, head_dim // 2)  # (..., T, d/2)


def precompute_freqs_cis(head_dim: int, end: int, theta: float, device=None) -> torch.Tensor:
    """complex64 (end, d/2): e^(i * angle) for positions 0 .. end-1."""
    angles = rope_angles(torch.arange(end, device=device), head_dim, theta)  # (end, d/2)
    return torch.polar(torch.ones_like(angles), angles)  # complex64


def _rotate_with(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Multiply the adjacent pairs of x, read as complex numbers, by freqs_cis."""
    # contiguous: view_as_complex needs even strides, which a slice of a wider tensor may lack
    x_ = torch.view_as_complex(x.float().contiguous().reshape(*x.shape[:-1], -1, 2))  # (..., T, d/2) complex64
    x_out = torch.view_as_real(x_ * freqs_cis).flatten(-2)  # (..., T, d)
    return x_out.type_as(x)


def apply_rope(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    angles = rope_angles(token_positions, x.shape[-1], theta)  # (..., T, d/2)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)  # (..., T, d/2) complex64
    return _rotate_with(x, freqs_cis)


def apply_rope_half(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    # The same complex product, with the real parts in the first half and the
    # imaginary parts in the second: pair k is (x[k], x[k + d/2]).
    half = x.shape[-1] // 2
    angles = rope_angles(token_positions, x.shape[-1], theta)  # (..., T, d/2)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    x_ = torch.complex(x[..., :half].float(), x[..., half:].float())  # (..., T, d/2)
    out = x_ * freqs_cis
    return torch.cat([out.real, out.imag], dim=-1).type_as(x)


def adjacent_to_half_permutation(head_dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    # Real parts (features 0, 2, 4, ...) first, then imaginary parts (1, 3, 5, ...).
    index = torch.arange(head_dim, device=device).view(head_dim // 2, 2)  # (d/2, 2): one pair a row
    return torch.cat([index[:, 0], index[:, 1]])


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
    *batch, seqlen, _ = x.shape
    head_dim = d_model // num_heads
    freqs_cis = precompute_freqs_cis(head_dim, max_seq_len, theta, device=x.device)  # (max_seq_len, d/2)
    if token_positions is None:
        token_positions = torch.arange(seqlen, device=x.device)
    # a table lookup: a position at or past max_seq_len is an IndexError
    freqs_cis = freqs_cis[token_positions]  # (..., T, d/2)

    xq, xk, xv = F.linear(x, w_q), F.linear(x, w_k), F.linear(x, w_v)
    xq = xq.view(*batch, seqlen, num_heads, head_dim)  # (..., T, H, d)
    xk = xk.view(*batch, seqlen, num_heads, head_dim)
    xv = xv.view(*batch, seqlen, num_heads, head_dim)

    # Meta's reshape_for_broadcast: one rotation per token, shared by its heads.
    freqs_cis = freqs_cis.unsqueeze(-2)  # (..., T, 1, d/2)
    xq, xk = _rotate_with(xq, freqs_cis), _rotate_with(xk, freqs_cis)

    xq, xk, xv = xq.transpose(-3, -2), xk.transpose(-3, -2), xv.transpose(-3, -2)  # (..., H, T, d)
    scores = torch.matmul(xq, xk.transpose(-2, -1)) / math.sqrt(head_dim)  # (..., H, T, T)
    mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device)
    mask = torch.triu(mask, diagonal=1)  # -inf above the diagonal, 0 elsewhere
    scores = scores + mask
    scores = F.softmax(scores.float(), dim=-1).type_as(xq)
    output = torch.matmul(scores, xv)  # (..., H, T, d)
    output = output.transpose(-3, -2).contiguous().view(*batch, seqlen, -1)  # (..., T, D)
    return F.linear(output, w_o)
