"""Chapter 5 in the style of Hugging Face transformers.

``inv_freq`` as in ``LlamaRotaryEmbedding`` (int64 ``arange`` moved to float),
angles as ``inv_freq @ position_ids``, ``emb = cat(freqs, freqs)`` and its
``cos``/``sin`` cast to the dtype of the vectors, then
``q * cos + rotate_half(q) * sin``; adjacent pairs with GPT-J's
``rotate_every_two`` and ``repeat_interleave``d cos/sin; the permutation as in
``convert_llama_weights_to_hf``; an eager attention with a ``finfo.min``
causal mask and ``softmax(..., dtype=torch.float32)``.
"""

import torch
from torch import nn


def _inv_freq(head_dim: int, theta: float, device) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float)
                            / head_dim))  # (d/2,)


def rope_angles(token_positions: torch.Tensor, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} is odd")
    inv_freq_expanded = _inv_freq(head_dim, theta, token_positions.device)[:, None]  # (d/2, 1)
    position_ids_expanded = token_positions[..., None, :].float()  # (..., 1, T)
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(-1, -2)  # (..., T, d/2)
    return freqs


def _cos_sin(token_positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype, interleaved: bool):
    freqs = rope_angles(token_positions, head_dim, theta)  # (..., T, d/2) float32
    if interleaved:
        emb = torch.repeat_interleave(freqs, 2, dim=-1)  # (..., T, d): a0 a0 a1 a1 ...
    else:
        emb = torch.cat((freqs, freqs), dim=-1)  # (..., T, d): a0 a1 ... a0 a1 ...
    cos = emb.cos()
    sin = emb.sin()
    return cos.to(dtype=dtype), sin.to(dtype=dtype)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)  # in einsum notation: rearrange(x, '... d j -> ... (d j)')


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    cos, sin = _cos_sin(token_positions, x.shape[-1], theta, x.dtype, interleaved=True)
    return (x * cos) + (rotate_every_two(x) * sin)


def apply_rope_half(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    cos, sin = _cos_sin(token_positions, x.shape[-1], theta, x.dtype, interleaved=False)
    return (x * cos) + (rotate_half(x) * sin)


def adjacent_to_half_permutation(head_dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    # convert_llama_weights_to_hf's permute, for one head and one index per row:
    # view(d/2, 2).transpose -> every first element of a pair, then every second.
    return torch.arange(head_dim, device=device).view(head_dim // 2, 2).transpose(0, 1).reshape(head_dim)


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
    input_shape = x.shape[:-1]
    head_dim = d_model // num_heads
    hidden_shape = (*input_shape, -1, head_dim)
    if token_positions is None:
        token_positions = torch.arange(input_shape[-1], device=x.device)
    if token_positions.max().item() >= max_seq_len:
        raise ValueError(f"position {token_positions.max().item()} is not below max_seq_len={max_seq_len}")

    query_states = nn.functional.linear(x, w_q).view(hidden_shape).transpose(-3, -2)  # (..., H, T, d)
    key_states = nn.functional.linear(x, w_k).view(hidden_shape).transpose(-3, -2)
    value_states = nn.functional.linear(x, w_v).view(hidden_shape).transpose(-3, -2)

    position_ids = token_positions.unsqueeze(-2)  # (..., 1, T): unsqueeze_dim for the heads
    query_states = apply_rope(query_states, position_ids, theta)
    key_states = apply_rope(key_states, position_ids, theta)

    scaling = head_dim ** -0.5
    attn_weights = torch.matmul(query_states, key_states.transpose(-2, -1)) * scaling  # (..., H, T, T)
    length = attn_weights.shape[-1]
    min_dtype = torch.finfo(attn_weights.dtype).min
    causal_mask = torch.full((length, length), fill_value=min_dtype, dtype=attn_weights.dtype, device=x.device)
    causal_mask = torch.triu(causal_mask, diagonal=1)
    attn_weights = attn_weights + causal_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
    attn_output = torch.matmul(attn_weights, value_states)  # (..., H, T, d)
    attn_output = attn_output.transpose(-3, -2).contiguous()  # (..., T, H, d)
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()  # (..., T, D)
    return nn.functional.linear(attn_output, w_o)
