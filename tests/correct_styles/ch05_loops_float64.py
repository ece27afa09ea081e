"""Chapter 5 the way a careful beginner writes it: explicit Python loops
(over the pairs of features, over the heads) and every computation in
float64 inside, cast back to the caller's dtype at the end. The angles are
computed in float64 from Python floats and rounded once to float32.
"""

import math

import torch


def rope_angles(token_positions: torch.Tensor, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    if head_dim % 2 != 0:
        raise ValueError("head_dim must be even")
    positions = token_positions.double()  # (..., T)
    angles = torch.empty(*token_positions.shape, head_dim // 2, dtype=torch.float64,
                         device=token_positions.device)
    for k in range(head_dim // 2):
        frequency = theta ** (-2.0 * k / head_dim)  # a Python float (double precision)
        angles[..., k] = positions * frequency
    return angles.float()  # float32, as asked


def apply_rope(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    d = x.shape[-1]
    angles = rope_angles(token_positions, d, theta).double()  # (..., T, d/2)
    x64 = x.double()
    out = x.new_zeros(x.shape, dtype=torch.float64)
    for k in range(d // 2):
        cos = torch.cos(angles[..., k])
        sin = torch.sin(angles[..., k])
        a = x64[..., 2 * k]
        b = x64[..., 2 * k + 1]
        out[..., 2 * k] = a * cos - b * sin
        out[..., 2 * k + 1] = a * sin + b * cos
    return out.to(x.dtype)


def apply_rope_half(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    d = x.shape[-1]
    half = d // 2
    angles = rope_angles(token_positions, d, theta).double()  # (..., T, d/2)
    x64 = x.double()
    out = x.new_zeros(x.shape, dtype=torch.float64)
    for k in range(half):
        cos = torch.cos(angles[..., k])
        sin = torch.sin(angles[..., k])
        a = x64[..., k]
        b = x64[..., k + half]
        out[..., k] = a * cos - b * sin
        out[..., k + half] = a * sin + b * cos
    return out.to(x.dtype)


def adjacent_to_half_permutation(head_dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    order = []
    for k in range(head_dim // 2):  # first feature of every pair
        order.append(2 * k)
    for k in range(head_dim // 2):  # then the second ones
        order.append(2 * k + 1)
    return torch.tensor(order, dtype=torch.int64, device=device)


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
    T = x.shape[-2]
    d = d_model // num_heads
    if token_positions is None:
        token_positions = torch.arange(T, device=x.device)
    for position in token_positions.flatten().tolist():
        if position >= max_seq_len:
            raise ValueError(f"position {position} is not below max_seq_len={max_seq_len}")

    x64 = x.double()
    q = x64 @ w_q.double().T  # (..., T, D)
    k = x64 @ w_k.double().T
    v = x64 @ w_v.double().T
    allowed = torch.tril(torch.ones(T, T, device=x.device)).bool()  # token t sees 0 .. t

    heads = []
    for h in range(num_heads):
        cols = slice(h * d, (h + 1) * d)
        q_h = apply_rope(q[..., cols], token_positions, theta)  # (..., T, d), float64
        k_h = apply_rope(k[..., cols], token_positions, theta)
        scores = q_h @ k_h.transpose(-2, -1) / math.sqrt(d)  # (..., T, T)
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        heads.append(weights @ v[..., cols])  # (..., T, d)
    out = torch.cat(heads, dim=-1) @ w_o.double().T  # (..., T, D)
    return out.to(x.dtype)
