"""Chapter 12's oracles: multi-head latent attention written head by head
with ``F.linear`` on each head's rows of the up-projections, RoPE as complex
numbers (Meta's llama, DeepSeek's inference code), and
``F.scaled_dot_product_attention(is_causal=True)`` with the scale
``1 / sqrt(d_h + d_R)`` given explicitly; the decoder's cache (latents and
rotated rope keys) from ``F.linear``; the cache sizes written out.

Shapes: x ``(B, T, D)``; a module's state in the course's names:
``q_down.weight (d_c', D)``, ``q_up.weight (H * d_h, d_c')``,
``q_rope.weight (H * d_R, d_c')``, ``kv_down.weight (d_c, D)``,
``k_up.weight`` and ``v_up.weight (H * d_h, d_c)``,
``k_rope.weight (d_R, D)``, ``out_proj.weight (D, H * d_h)``; ``H`` is
``q_rope``'s rows over ``k_rope``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grader.oracles import gradients

__all__ = ["cache_bytes", "latent_cache", "mha_cache_bytes", "mla", "mla_from_products"]

THETA = 10000.0


def _rotate(x, positions):
    """RoPE on the last axis of ``x`` (``(..., T, d)``) as complex numbers:
    pair k is the complex number ``x[2k] + i x[2k + 1]``, times
    ``exp(i * position * theta ** (-2k / d))``."""
    width = x.shape[-1]
    frequencies = 1.0 / THETA ** (torch.arange(0, width, 2, dtype=torch.float32) / width)  # (d/2,)
    angles = torch.outer(positions.to(torch.float32), frequencies)  # (T, d/2)
    turn = torch.polar(torch.ones_like(angles), angles).to(torch.complex128)
    pairs = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)  # (..., T, d)


def _sizes(state):
    rope_dim = state["k_rope.weight"].shape[0]
    heads = state["q_rope.weight"].shape[0] // rope_dim
    head_dim = state["q_up.weight"].shape[0] // heads
    return heads, head_dim, rope_dim


def latent_cache(state, x):
    """``(latent, rope_keys)``, ``(B, T, d_c)`` and ``(B, T, d_R)``: every
    token's ``c_KV`` and its rope key rotated at its position."""
    positions = torch.arange(x.shape[1])
    latent = F.linear(x, state["kv_down.weight"])
    rope_keys = _rotate(F.linear(x, state["k_rope.weight"]), positions)
    return latent, rope_keys


def mla(state, x):
    """MultiHeadLatentAttention holding ``state`` on ``x``, computed in
    float64 head by head: ``(B, T, D)`` in ``x``'s dtype."""
    heads, head_dim, rope_dim = _sizes(state)
    w = {name: value.to(torch.float64) for name, value in state.items()}
    h = x.to(torch.float64)
    positions = torch.arange(x.shape[1])
    c_q = F.linear(h, w["q_down.weight"])  # (B, T, d_c')
    c_kv = F.linear(h, w["kv_down.weight"])  # (B, T, d_c)
    k_rope = _rotate(F.linear(h, w["k_rope.weight"]), positions)  # (B, T, d_R), one for every head
    outputs = []
    for head in range(heads):
        rows = slice(head * head_dim, (head + 1) * head_dim)
        rope_rows = slice(head * rope_dim, (head + 1) * rope_dim)
        q = torch.cat([F.linear(c_q, w["q_up.weight"][rows]),
                       _rotate(F.linear(c_q, w["q_rope.weight"][rope_rows]), positions)], dim=-1)
        k = torch.cat([F.linear(c_kv, w["k_up.weight"][rows]), k_rope], dim=-1)
        v = F.linear(c_kv, w["v_up.weight"][rows])
        outputs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                      scale=(head_dim + rope_dim) ** -0.5))
    merged = torch.cat(outputs, dim=-1)  # (B, T, H * d_h), head h at columns h * d_h ..
    return F.linear(merged, w["out_proj.weight"]).to(x.dtype)


def mla_gradient(state, x, upstream):
    """The gradient of ``<mla(state, x), upstream>`` with respect to x, by autograd (float64 inside)."""
    (gradient,) = gradients(lambda t: mla(state, t), [x], [0], upstream)
    return gradient


def mla_from_products(state, x):
    """With ``q_rope`` and ``k_rope`` zero, MLA is multi-head attention with
    the weights ``W_UQ W_DQ``, ``W_UK W_DKV``, ``W_UV W_DKV`` and ``W_O``,
    position-free, scaled by ``1 / sqrt(d_h + d_R)`` all the same: the
    zero rope features add nothing to the scores but their width."""
    heads, head_dim, rope_dim = _sizes(state)
    w = {name: value.to(torch.float64) for name, value in state.items()}
    h = x.to(torch.float64)
    batch, length, _ = x.shape

    def project(up, down):  # (B, H, T, d_h)
        return F.linear(h, w[up] @ w[down]).view(batch, length, heads, head_dim).transpose(1, 2)

    q, k, v = (project("q_up.weight", "q_down.weight"), project("k_up.weight", "kv_down.weight"),
               project("v_up.weight", "kv_down.weight"))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=(head_dim + rope_dim) ** -0.5)
    return F.linear(out.transpose(1, 2).reshape(batch, length, -1), w["out_proj.weight"]).to(x.dtype)


# Bytes of one number, written out here rather than read from torch.
BYTES_PER_NUMBER = {torch.float64: 8, torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.int8: 1}


def cache_bytes(batch, seq_len, num_layers, num_heads, head_dim, kv_rank, rope_dim, dtype):
    """(d_c + d_R) numbers a token a layer, for every sequence: B x T x layers x (d_c + d_R) x bytes."""
    return batch * seq_len * num_layers * (kv_rank + rope_dim) * BYTES_PER_NUMBER[dtype]


def mha_cache_bytes(batch, seq_len, num_layers, num_kv_heads, head_dim, dtype):
    """Chapter 6's KV cache: 2 (a key and a value) x B x T x layers x H_kv x d_h x bytes."""
    return 2 * batch * seq_len * num_layers * num_kv_heads * head_dim * BYTES_PER_NUMBER[dtype]
