"""Chapter 5's oracles: other people's RoPE code, not the course's. Meta's
LLaMA (adjacent pairs as complex numbers), Hugging Face's LLaMA
(``x * cos + rotate_half(x) * sin``), the angles with Python's math, and
attention with complex RoPE from ``F.scaled_dot_product_attention``, with
gradients by autograd.

Shapes: x ``(..., T, d)``; positions int64, broadcastable to ``(..., T)``;
angles ``(..., T, d/2)``; for attention x ``(..., T, D)`` with ``D = H * d``,
weights ``(D, D)`` as ``F.linear`` takes them, heads ``(..., H, T, d)``.
Angles are float32, as the chapter's rules say.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grader.oracles import gradients

__all__ = ["angles_by_hand", "complex_rope", "complex_rope_gradient", "complex_rope_matrices",
           "frequencies", "hf_rope", "hf_rope_matrices", "rope_attention", "rope_attention_gradients"]


def frequencies(head_dim, theta):
    """float32 ``(d/2,)``: 1 / theta^(2k/d), computed in float64 as Meta's and
    Hugging Face's code write it (``arange(0, d, 2) / d``)."""
    return (1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)).float()


def angles_by_hand(positions, head_dim, theta):
    """Entry k of token t: position * theta^(-2k/d), each one with Python's
    math, as float32 ``(*positions.shape, d/2)``."""
    flat = [[p * theta ** (-2 * k / head_dim) for k in range(head_dim // 2)]
            for p in positions.flatten().tolist()]
    return torch.tensor(flat, dtype=torch.float64).reshape(*positions.shape, head_dim // 2).float()


def complex_rope(x, positions, theta=10000.0):
    """Meta's LLaMA: adjacent pairs as complex numbers, times e^(i angle), in
    float32; the answer in x's dtype, ``(..., T, d)``."""
    head_dim = x.shape[-1]
    angles = positions.float().unsqueeze(-1) * frequencies(head_dim, theta)  # (..., T, d/2)
    turns = torch.polar(torch.ones_like(angles), angles)  # complex64 (..., T, d/2)
    pairs = torch.view_as_complex(x.float().contiguous().unflatten(-1, (-1, 2)))  # (..., T, d/2)
    return torch.view_as_real(pairs * turns).flatten(-2).to(x.dtype)  # (..., T, d)


def hf_rope(x, positions, theta=10000.0):
    """Hugging Face's LLaMA: ``q * cos + rotate_half(q) * sin`` with
    ``emb = cat(freqs, freqs)``, in float32; the answer in x's dtype."""
    head_dim = x.shape[-1]
    freqs = positions.float().unsqueeze(-1) * frequencies(head_dim, theta)  # (..., T, d/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (..., T, d)
    x1, x2 = x.float()[..., : head_dim // 2], x.float()[..., head_dim // 2:]
    rotate_half = torch.cat((-x2, x1), dim=-1)
    return (x.float() * emb.cos() + rotate_half * emb.sin()).to(x.dtype)


def _matrices(rope, positions, head_dim):
    """Each token's rotation as a ``(d, d)`` matrix M, ``rope(x) = x @ M``:
    row i is the rotated basis vector e_i. ``(*positions.shape, d, d)``."""
    basis = torch.eye(head_dim).expand(*positions.shape, head_dim, head_dim)  # (..., T, d, d)
    return rope(basis, positions.unsqueeze(-1).expand(*positions.shape, head_dim))


def complex_rope_matrices(positions, head_dim):
    """``complex_rope`` at each position as a matrix: ``(..., T, d, d)``."""
    return _matrices(complex_rope, positions, head_dim)


def hf_rope_matrices(positions, head_dim):
    """``hf_rope`` at each position as a matrix: ``(..., T, d, d)``."""
    return _matrices(hf_rope, positions, head_dim)


def complex_rope_gradient(x, positions, upstream):
    """The gradient of ``<complex_rope(x, positions), upstream>`` with respect to x."""
    (gradient,) = gradients(complex_rope, [x, positions], [0], upstream)
    return gradient


def rope_attention(x, w_q, w_k, w_v, w_o, num_heads, positions, theta):
    """Heads split by hand, complex RoPE on q and k, then
    ``F.scaled_dot_product_attention(is_causal=True)``: ``(..., T, D)``.
    positions None means 0 .. T-1."""
    length, d_model = x.shape[-2:]
    if positions is None:
        positions = torch.arange(length)
    head_dim = d_model // num_heads

    def heads(w):  # (..., H, T, d)
        return F.linear(x, w).unflatten(-1, (num_heads, head_dim)).transpose(-3, -2)

    q, k, v = heads(w_q), heads(w_k), heads(w_v)
    per_head = positions.unsqueeze(-2)  # (..., 1, T)
    q, k = complex_rope(q, per_head, theta), complex_rope(k, per_head, theta)
    mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (..., H, T, d)
    return F.linear(mixed.transpose(-3, -2).flatten(-2), w_o)  # (..., T, D)


def rope_attention_gradients(x, w_q, w_k, w_v, w_o, num_heads, positions, theta, upstream):
    """Gradients of ``<rope_attention(...), upstream>`` with respect to w_q,
    w_k, w_v, w_o and x, in that order."""
    return gradients(lambda w_q, w_k, w_v, w_o, x: rope_attention(x, w_q, w_k, w_v, w_o, num_heads, positions,
                                                                  theta),
                     [w_q, w_k, w_v, w_o, x], [0, 1, 2, 3, 4], upstream)
