"""Chapter 12 written with Python loops over heads and tokens, in float64
inside: each head's queries, keys and values from its rows of the weights,
RoPE as explicit 2x2 rotations of each pair, the softmax of each query over
the tokens it may see; the decode precomputes the absorbed matrices of the
paper (W_UK_h^T W_UQ_h for each head, and W_O's block of head h times
W_UV_h), as DeepSeek-V2 describes absorbing them."""

import math

import torch
from torch import nn


def rotate_pairs(vector, position, theta=10000.0):
    """One vector (d,) rotated pair by pair at one position, in float64."""
    width = vector.shape[-1]
    out = vector.clone()
    for k in range(width // 2):
        # The angle rounded to float32, as the course computes angles.
        angle = float(torch.tensor(position, dtype=torch.float32) * torch.tensor(theta ** (-2 * k / width),
                                                                                  dtype=torch.float32))
        c, s = math.cos(angle), math.sin(angle)
        a, b = vector[..., 2 * k], vector[..., 2 * k + 1]
        out[..., 2 * k] = a * c - b * s
        out[..., 2 * k + 1] = a * s + b * c
    return out


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, num_heads, head_dim, rope_dim, kv_rank, q_rank):
        super().__init__()
        self.sizes = (num_heads, head_dim, rope_dim)
        self.q_down = nn.Linear(d_model, q_rank, bias=False)
        self.q_up = nn.Linear(q_rank, num_heads * head_dim, bias=False)
        self.q_rope = nn.Linear(q_rank, num_heads * rope_dim, bias=False)
        self.kv_down = nn.Linear(d_model, kv_rank, bias=False)
        self.k_up = nn.Linear(kv_rank, num_heads * head_dim, bias=False)
        self.v_up = nn.Linear(kv_rank, num_heads * head_dim, bias=False)
        self.k_rope = nn.Linear(d_model, rope_dim, bias=False)
        self.out_proj = nn.Linear(num_heads * head_dim, d_model, bias=False)

    def forward(self, x):
        heads, head_dim, rope_dim = self.sizes
        w = {name: p.double() for name, p in self.named_parameters()}
        batch, length, _ = x.shape
        outputs = []
        for b in range(batch):
            h = x[b].double()  # (T, D)
            c_q = h @ w["q_down.weight"].T
            c_kv = h @ w["kv_down.weight"].T
            k_r = torch.stack([rotate_pairs(h[t] @ w["k_rope.weight"].T, t) for t in range(length)])
            per_head = []
            for head in range(heads):
                rows = slice(head * head_dim, (head + 1) * head_dim)
                rope_rows = slice(head * rope_dim, (head + 1) * rope_dim)
                q_c = c_q @ w["q_up.weight"][rows].T
                q_r = torch.stack([rotate_pairs(c_q[t] @ w["q_rope.weight"][rope_rows].T, t) for t in range(length)])
                k_c = c_kv @ w["k_up.weight"][rows].T
                v = c_kv @ w["v_up.weight"][rows].T
                rows_out = []
                for t in range(length):
                    scores = (k_c[: t + 1] @ q_c[t] + k_r[: t + 1] @ q_r[t]) / math.sqrt(head_dim + rope_dim)
                    weights = torch.exp(scores - scores.max())
                    rows_out.append((weights / weights.sum()) @ v[: t + 1])
                per_head.append(torch.stack(rows_out))
            outputs.append(torch.cat(per_head, dim=-1) @ w["out_proj.weight"].T)
        return torch.stack(outputs).to(x.dtype)


def absorbed_decode(module, x, cache=None):
    rope_dim = module.k_rope.weight.shape[0]
    heads = module.q_rope.weight.shape[0] // rope_dim
    head_dim = module.q_up.weight.shape[0] // heads
    w = {name: p.double() for name, p in module.named_parameters()}
    batch = x.shape[0]
    past = 0 if cache is None else cache[0].shape[1]
    outputs, latents, rope_keys = [], [], []
    for b in range(batch):
        h = x[b, 0].double()  # (D,)
        c_q = w["q_down.weight"] @ h
        c_new = w["kv_down.weight"] @ h
        k_new = rotate_pairs(w["k_rope.weight"] @ h, past)
        latent = c_new[None] if cache is None else torch.cat([cache[0][b].double(), c_new[None]])
        keys = k_new[None] if cache is None else torch.cat([cache[1][b].double(), k_new[None]])
        out = torch.zeros(w["out_proj.weight"].shape[0], dtype=torch.float64, device=x.device)
        for head in range(heads):
            rows = slice(head * head_dim, (head + 1) * head_dim)
            rope_rows = slice(head * rope_dim, (head + 1) * rope_dim)
            absorbed_q = w["k_up.weight"][rows].T @ w["q_up.weight"][rows]  # (d_c, d_c'): W_UK_h^T W_UQ_h
            absorbed_o = w["out_proj.weight"][:, rows] @ w["v_up.weight"][rows]  # (D, d_c): W_O,h W_UV_h
            q_latent = absorbed_q @ c_q
            q_r = rotate_pairs(w["q_rope.weight"][rope_rows] @ c_q, past)
            scores = (latent @ q_latent + keys @ q_r) / math.sqrt(head_dim + rope_dim)
            weights = torch.exp(scores - scores.max())
            out = out + absorbed_o @ ((weights / weights.sum()) @ latent)
        outputs.append(out)
        latents.append(latent)
        rope_keys.append(keys)
    dtype = x.dtype
    return (torch.stack(outputs)[:, None].to(dtype),
            (torch.stack(latents).to(dtype), torch.stack(rope_keys).to(dtype)))


def latent_cache_bytes(batch, seq_len, num_layers, num_heads, head_dim, kv_rank, rope_dim, dtype):
    total = 0
    for _ in range(num_layers):
        for _ in range(batch):
            total += seq_len * (kv_rank + rope_dim)
    return total * dtype.itemsize
