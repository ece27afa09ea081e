"""Chapter 10 written with triangles, einsum and 2 x 2 rotation matrices, in float64 inside.

The mask is a band of two ``tril``s (the causal one with offset ``S - L``,
minus the one ``W`` further down) with the sinks' columns added back under
the causal triangle. The buffer is written with ``scatter`` along the token
axis. A step finds the oldest slot of the ring and numbers the ring from
it (``(slot - oldest) % W``); RoPE is a ``(n, d/2, 2, 2)`` stack of rotation
matrices applied with ``einsum``, and attention is ``einsum`` with an
additive ``-inf`` mask, computed in float64 and cast back.
"""

import torch


def sliding_window_mask(query_len, key_len, window, sinks=0, device=None):
    ones = torch.ones(query_len, key_len, dtype=torch.bool, device=device)
    causal = ones.tril(key_len - query_len)
    too_old = ones.tril(key_len - query_len - window)
    sink_columns = torch.zeros_like(ones)
    sink_columns[:, :sinks] = True
    return causal & (~too_old | sink_columns)


def rolling_cache_append(k_cache, v_cache, k_new, v_new, count, sinks=0):
    window = k_cache.shape[2] - sinks
    slot = count if count < sinks else sinks + (count - sinks) % window
    batch, heads = k_cache.shape[:2]
    index_k = torch.full((batch, heads, 1, k_cache.shape[3]), slot, device=k_cache.device)
    index_v = torch.full((batch, heads, 1, v_cache.shape[3]), slot, device=v_cache.device)
    return k_cache.scatter(2, index_k, k_new), v_cache.scatter(2, index_v, v_new)


def _rotation(positions, dim, theta):
    k = torch.arange(dim // 2, device=positions.device, dtype=torch.float32)
    angles = (positions.to(torch.float32)[:, None] * theta ** (-2 * k / dim)).double()  # (n, d/2)
    cos, sin = angles.cos(), angles.sin()
    return torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # (n, d/2, 2, 2)


def _rope(x, positions, theta):
    pairs = x.unflatten(-1, (-1, 2))  # (B, H, n, d/2, 2)
    return torch.einsum("nkij,bhnkj->bhnki", _rotation(positions, x.shape[-1], theta), pairs).flatten(-2)


def streaming_attention_step(x_new, num_heads, w_q, w_k, w_v, w_o, k_cache, v_cache, count, sinks=0,
                             theta=10000.0):
    x = x_new.double()
    q = torch.einsum("btm,hm->bth", x, w_q.double()).unflatten(-1, (num_heads, -1)).transpose(1, 2)
    k = torch.einsum("btm,hm->bth", x, w_k.double()).unflatten(-1, (num_heads, -1)).transpose(1, 2)
    v = torch.einsum("btm,hm->bth", x, w_v.double()).unflatten(-1, (num_heads, -1)).transpose(1, 2)
    k_cache, v_cache = rolling_cache_append(k_cache, v_cache, k.to(k_cache.dtype), v.to(v_cache.dtype), count, sinks)
    capacity = k_cache.shape[2]
    window = capacity - sinks
    slots = torch.arange(capacity, device=x_new.device)
    if count + 1 >= capacity:  # full: the ring is numbered from its oldest slot
        oldest = sinks + (count + 1 - sinks) % window
        positions = torch.where(slots < sinks, slots, sinks + (slots - oldest) % window)
        query_position = capacity - 1
    else:
        positions, query_position = slots, count
    keys = k_cache.double()
    if theta is not None:
        keys = _rope(keys, positions, theta)
        q = _rope(q, torch.tensor([query_position], device=x_new.device), theta)
    bias = torch.zeros(capacity, dtype=torch.float64, device=x_new.device)
    bias = bias.masked_fill(slots > count, float("-inf"))
    scores = torch.einsum("bhqd,bhkd->bhqk", q, keys) / q.shape[-1] ** 0.5 + bias
    weights = scores.softmax(dim=-1)
    heads = torch.einsum("bhqk,bhkd->bqhd", weights, v_cache.double()).flatten(-2)
    return torch.einsum("bqe,oe->bqo", heads, w_o.double()).to(x_new.dtype), (k_cache, v_cache)
