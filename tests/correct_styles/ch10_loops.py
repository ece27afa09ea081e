"""Chapter 10 written with Python loops over tokens, slots and heads.

The mask is filled entry by entry; the slot of a token is found by walking
the ring; a step lists the held tokens by replaying which token each slot
last received (plain Python integers, so nothing grows with ``count`` but a
loop over the buffer's slots), rotates every head's vectors pair by pair
with ``math.cos``/``math.sin`` of float32 angles, and computes the softmax
by hand in float64 before casting back.
"""

import math

import torch


def sliding_window_mask(query_len, key_len, window, sinks=0, device=None):
    rows = []
    for i in range(query_len):
        position = i + key_len - query_len
        row = []
        for j in range(key_len):
            row.append(j <= position and (position - j < window or j < sinks))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool, device=device).reshape(query_len, key_len)


def _slot(count, capacity, sinks):
    if count < sinks:
        return count
    ring = capacity - sinks
    steps = (count - sinks) % ring
    return sinks + steps


def rolling_cache_append(k_cache, v_cache, k_new, v_new, count, sinks=0):
    slot = _slot(count, k_cache.shape[2], sinks)
    k_out, v_out = k_cache.clone(), v_cache.clone()
    for b in range(k_cache.shape[0]):
        for h in range(k_cache.shape[1]):
            k_out[b, h, slot] = k_new[b, h, 0]
            v_out[b, h, slot] = v_new[b, h, 0]
    return k_out, v_out


def _held(count, capacity, sinks):
    """(slot, text position) of every held token after token ``count`` was written."""
    ring = capacity - sinks
    pairs = []
    for slot in range(capacity):
        if slot < sinks:
            token = slot
        else:
            token = count - ((count - slot) % ring)  # the last token written to this slot
        if 0 <= token <= count and (slot < sinks or token >= sinks):
            pairs.append((token, slot))
    return sorted(pairs)


def _rotate(vector, position, theta):
    out = vector.clone()
    d = vector.shape[-1]
    for k in range(d // 2):
        frequency = torch.tensor(theta, dtype=torch.float32) ** torch.tensor(-2.0 * k / d, dtype=torch.float32)
        angle = float(torch.tensor(float(position), dtype=torch.float32) * frequency)
        c, s = math.cos(angle), math.sin(angle)
        a, b = vector[..., 2 * k], vector[..., 2 * k + 1]
        out[..., 2 * k] = a * c - b * s
        out[..., 2 * k + 1] = a * s + b * c
    return out


def streaming_attention_step(x_new, num_heads, w_q, w_k, w_v, w_o, k_cache, v_cache, count, sinks=0,
                             theta=10000.0):
    batch = x_new.shape[0]
    q_all, k_all, v_all = x_new[:, 0] @ w_q.T, x_new[:, 0] @ w_k.T, x_new[:, 0] @ w_v.T  # (B, D)
    d, d_v = q_all.shape[-1] // num_heads, v_all.shape[-1] // num_heads
    k_new = k_all.reshape(batch, num_heads, 1, d)
    v_new = v_all.reshape(batch, num_heads, 1, d_v)
    k_cache, v_cache = rolling_cache_append(k_cache, v_cache, k_new, v_new, count, sinks)
    held = _held(count, k_cache.shape[2], sinks)
    heads = []
    for h in range(num_heads):
        q = q_all[:, h * d:(h + 1) * d]  # (B, d)
        if theta is not None:
            q = _rotate(q, len(held) - 1, theta)
        scores = []
        for position, (_, slot) in enumerate(held):
            key = k_cache[:, h, slot]  # (B, d)
            if theta is not None:
                key = _rotate(key, position, theta)
            scores.append((q.double() * key.double()).sum(-1) / math.sqrt(d))  # (B,)
        scores = torch.stack(scores, dim=-1)  # (B, n)
        weights = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = 0
        for index, (_, slot) in enumerate(held):
            out = out + weights[:, index:index + 1] * v_cache[:, h, slot].double()
        heads.append(out.to(x_new.dtype))  # (B, d_v)
    merged = torch.cat(heads, dim=-1)  # (B, H * d_v)
    return (merged @ w_o.T).unsqueeze(1), (k_cache, v_cache)
