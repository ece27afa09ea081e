"""Chapter 5 in the style of GPT-NeoX (EleutherAI), as ported to Hugging Face.

A ``RotaryEmbedding``-like table of ``cos``/``sin`` for positions
``0 .. seq_len-1`` built with ``einsum("i,j->ij", t, inv_freq)`` and
``cat((freqs, freqs))``, looked up with ``cos[position_ids]``; the rotate-half
convention is NeoX's own, and adjacent pairs go through it by permuting the
features there and back. The attention uses NeoX's fused ``query_key_value``
projection (q, k, v side by side within each head), ``baddbmm`` with the
norm factor, a ``tril`` causal buffer sliced to the sequence and
``torch.where(causal_mask, scores, finfo.min)``.
"""

import torch
import torch.nn.functional as F


def rope_angles(token_positions: torch.Tensor, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    if head_dim % 2 != 0:
        raise ValueError("rotary dims must be even")
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float().to(token_positions.device)
                                / head_dim))  # (d/2,)
    return torch.einsum("...t,j->...tj", token_positions.float(), inv_freq)  # (..., T, d/2)


def _cos_sin_cache(seq_len: int, head_dim: int, theta: float, device):
    """cos and sin of every angle, (seq_len, d) each: NeoX's cos_cached and sin_cached."""
    t = torch.arange(seq_len, device=device)  # positions 0 .. seq_len - 1
    freqs = rope_angles(t, head_dim, theta)  # (seq_len, d/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (seq_len, d)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=x1.ndim - 1)


def apply_rope_half(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    seq_len = int(token_positions.max()) + 1
    cos_cached, sin_cached = _cos_sin_cache(seq_len, x.shape[-1], theta, token_positions.device)
    cos, sin = cos_cached[token_positions], sin_cached[token_positions]  # (..., T, d) float32
    x_ = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # rotate in float32 at least
    out = (x_ * cos) + (rotate_half(x_) * sin)
    return out.to(x.dtype)


def adjacent_to_half_permutation(head_dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    # A stable sort by parity keeps 0, 2, 4, ... in order, then 1, 3, 5, ...
    features = torch.arange(head_dim, device=device)
    return torch.argsort(features % 2, stable=True)


def apply_rope(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    # NeoX only knows rotate_half: move each adjacent pair to (k, k + d/2),
    # rotate there, and put the features back where they came from.
    perm = adjacent_to_half_permutation(x.shape[-1], device=x.device)
    inverse = torch.argsort(perm)
    return apply_rope_half(x[..., perm], token_positions, theta)[..., inverse]


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
    *batch, seq_len, _ = x.shape
    head_size = d_model // num_heads
    if token_positions is None:
        token_positions = torch.arange(seq_len, device=x.device)
    if token_positions.max() >= max_seq_len:
        raise ValueError(f"positions must be below max_position_embeddings={max_seq_len}")

    # NeoX's query_key_value: for each head, its q, k and v rows one after the other.
    w_qkv = torch.stack([w.view(num_heads, head_size, d_model) for w in (w_q, w_k, w_v)], dim=1)
    qkv = F.linear(x, w_qkv.reshape(3 * d_model, d_model))  # (..., T, 3D)
    qkv = qkv.view(*batch, seq_len, num_heads, 3 * head_size)  # (..., T, H, 3d)
    query = qkv[..., :head_size].transpose(-3, -2)  # (..., H, T, d)
    key = qkv[..., head_size: 2 * head_size].transpose(-3, -2)
    value = qkv[..., 2 * head_size:].transpose(-3, -2)

    position_ids = token_positions.unsqueeze(-2)  # (..., 1, T)
    query = apply_rope(query, position_ids, theta)
    key = apply_rope(key, position_ids, theta)

    # baddbmm wants (batch * heads, T, d)
    query = query.reshape(-1, seq_len, head_size)
    key = key.reshape(-1, seq_len, head_size)
    norm_factor = head_size ** -0.5
    attn_scores = torch.zeros(query.shape[0], seq_len, seq_len, dtype=query.dtype, device=query.device)
    attn_scores = torch.baddbmm(attn_scores, query, key.transpose(1, 2), beta=1.0, alpha=norm_factor)
    attn_scores = attn_scores.view(*batch, num_heads, seq_len, seq_len)

    bias = torch.tril(torch.ones((max_seq_len, max_seq_len), dtype=torch.bool, device=x.device))
    causal_mask = bias[:seq_len, :seq_len]
    mask_value = torch.finfo(attn_scores.dtype).min
    # NeoX: a tensor, not a Python float, to avoid a dtype error in torch.where
    mask_value = torch.tensor(mask_value, dtype=attn_scores.dtype).to(attn_scores.device)
    attn_scores = torch.where(causal_mask, attn_scores, mask_value)

    attn_weights = F.softmax(attn_scores, dim=-1)
    attn_weights = attn_weights.to(value.dtype)
    attn_output = torch.matmul(attn_weights, value)  # (..., H, T, d)
    attn_output = attn_output.transpose(-3, -2).reshape(*batch, seq_len, d_model)  # (..., T, D)
    return F.linear(attn_output, w_o)
