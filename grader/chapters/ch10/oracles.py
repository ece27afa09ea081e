"""Chapter 10's oracles: the sink-plus-window mask from a loop over query
and key positions, the rolling buffer by simulating its evictions token by
token (a list of the tokens it holds, the oldest non-sink one replaced),
and streaming decoding recomputed from the whole text: PyTorch's
``F.scaled_dot_product_attention`` under the mask (no RoPE), or the visible
tokens gathered in text order and rotated at positions ``0 .. n - 1``
(StreamingLLM), one step at a time.

Shapes: x ``(B, T, d_model)``; weights in ``nn.Linear`` layout: w_q, w_k
``(D, d_model)``, w_v ``(D_v, d_model)``, w_o ``(d_out, D_v)``, with
``D = H * d``; buffers ``(B, H, C, d)``; keys and values of a whole text
``(B, H, T, d)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["causal_mask", "causal_rope_attention", "keys_and_values", "rolling_buffer", "rolling_cache_append",
           "sliding_window_mask", "slot_tokens", "streaming_attention_step", "streaming_decode"]


def sliding_window_mask(query_len, key_len, window, sinks=0):
    """``(L, S)`` bool, built entry by entry: query i at position
    i + S - L sees key j when j is at most its position and within the
    last ``window`` positions, or a sink."""
    mask = torch.zeros(query_len, key_len, dtype=torch.bool)
    for i in range(query_len):
        position = i + key_len - query_len
        for j in range(key_len):
            in_window = position - window < j
            mask[i, j] = j <= position and (in_window or j < sinks)
    return mask


def causal_mask(num_queries, num_keys):
    """Chapter 4's bottom-right causal mask ``(L, S)``, as ``tril``."""
    return torch.ones(num_queries, num_keys, dtype=torch.bool).tril(num_keys - num_queries)


def slot_tokens(count, capacity, sinks):
    """The token each slot holds after tokens ``0 .. count - 1`` were
    appended, ``-1`` for an empty slot, by replaying the evictions: a new
    token takes the first empty slot, or else the slot of the oldest token
    that is not a sink."""
    ring = capacity - sinks
    shift = 0
    if count > capacity + ring:  # once full, a whole turn of the ring leaves every slot's token ring later
        shift = (count - capacity) // ring * ring
        count -= shift
    held = [-1] * capacity
    for t in range(count):
        if -1 in held:
            held[held.index(-1)] = t
        else:
            oldest = min((token, s) for s, token in enumerate(held) if token >= sinks)[1]
            held[oldest] = t
    return [token if token < sinks else token + shift for token in held]


def rolling_cache_append(k_cache, v_cache, k_new, v_new, count, sinks=0):
    """The buffers with token ``count`` written where the replay puts it:
    the slot of the first token missing from the held list after it."""
    capacity = k_cache.shape[-2]
    before, after = slot_tokens(count, capacity, sinks), slot_tokens(count + 1, capacity, sinks)
    slot = next(s for s in range(capacity) if before[s] != after[s])
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    k_cache[:, :, slot:slot + 1] = k_new
    v_cache[:, :, slot:slot + 1] = v_new
    return k_cache, v_cache


def rolling_buffer(k, v, count, capacity, sinks, fill=0.0):
    """The buffers ``(B, H, C, ·)`` after tokens ``0 .. count - 1`` of the
    text's keys and values ``k``, ``v`` ``(B, H, T, ·)`` were appended;
    empty slots hold ``fill``."""
    held = slot_tokens(count, capacity, sinks)
    k_buffer = torch.full((*k.shape[:2], capacity, k.shape[-1]), fill, dtype=k.dtype)
    v_buffer = torch.full((*v.shape[:2], capacity, v.shape[-1]), fill, dtype=v.dtype)
    for slot, token in enumerate(held):
        if token >= 0:
            k_buffer[:, :, slot], v_buffer[:, :, slot] = k[:, :, token], v[:, :, token]
    return k_buffer, v_buffer


def _rotate(t, positions, theta):
    """RoPE on adjacent pairs through complex multiplication: ``t``
    ``(..., n, d)`` turned by ``positions`` ``(n,)`` (angles in float32)."""
    d = t.shape[-1]
    frequencies = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.outer(positions.to(torch.float32), frequencies)  # (n, d/2)
    turns = torch.polar(torch.ones_like(angles), angles).to(torch.complex128)
    pairs = torch.view_as_complex(t.to(torch.float64).reshape(*t.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * turns).flatten(-2).to(t.dtype)


def _heads(t, num_heads):
    """``(B, T, D) -> (B, H, T, d)``."""
    return t.unflatten(-1, (num_heads, -1)).transpose(1, 2)


def _attend(q, k, v, positions, query_position, theta):
    """One query ``(B, H, 1, d)`` over keys ``(B, H, n, d)`` at ``positions``."""
    if theta is not None:
        k = _rotate(k, positions, theta)
        q = _rotate(q, torch.tensor([query_position]), theta)
    return F.scaled_dot_product_attention(q, k, v)  # (B, H, 1, d_v)


def streaming_attention_step(x_new, num_heads, w_q, w_k, w_v, w_o, k_cache, v_cache, count, sinks=0,
                             theta=10000.0):
    """``(output, (k_cache, v_cache))``: the held tokens (from the replay)
    sorted by text position, at positions ``0 .. n - 1``, the new one last."""
    q, k, v = (_heads(F.linear(x_new, w), num_heads) for w in (w_q, w_k, w_v))  # (B, H, 1, ·)
    k_cache, v_cache = rolling_cache_append(k_cache, v_cache, k, v, count, sinks)
    held = slot_tokens(count + 1, k_cache.shape[-2], sinks)
    order = sorted((token, slot) for slot, token in enumerate(held) if token >= 0)
    slots = torch.tensor([slot for _, slot in order])
    positions = torch.arange(len(order))
    heads = _attend(q, k_cache[:, :, slots], v_cache[:, :, slots], positions, len(order) - 1, theta)
    return F.linear(heads.transpose(1, 2).flatten(-2), w_o), (k_cache, v_cache)


def streaming_decode(x, num_heads, w_q, w_k, w_v, w_o, capacity, sinks, theta):
    """Every step's output ``(B, T, d_out)``, recomputed from the whole
    text: without RoPE, PyTorch's attention under the sink-plus-window mask
    in one call; with it, each token's visible tokens gathered in text
    order and rotated at positions ``0 .. n - 1``."""
    length = x.shape[1]
    q, k, v = (_heads(F.linear(x, w), num_heads) for w in (w_q, w_k, w_v))  # (B, H, T, ·)
    mask = sliding_window_mask(length, length, capacity - sinks, sinks)  # (T, T)
    if theta is None:
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, d_v)
    else:
        rows = []
        for t in range(length):
            visible = mask[t].nonzero().flatten()  # text order
            rows.append(_attend(q[:, :, t:t + 1], k[:, :, visible], v[:, :, visible],
                                torch.arange(len(visible)), len(visible) - 1, theta))
        heads = torch.cat(rows, dim=2)  # (B, H, T, d_v)
    return F.linear(heads.transpose(1, 2).flatten(-2), w_o)


def keys_and_values(x, num_heads, w_k, w_v):
    """Every token's key and value, split into heads: ``(B, H, T, d)`` and
    ``(B, H, T, d_v)``, unrotated."""
    return _heads(F.linear(x, w_k), num_heads), _heads(F.linear(x, w_v), num_heads)


def causal_rope_attention(x, num_heads, w_q, w_k, w_v, w_o, theta):
    """Causal multi-head attention with RoPE at text positions ``0 .. T - 1``:
    ``(B, T, d_out)``, from ``F.scaled_dot_product_attention(is_causal=True)``."""
    q, k, v = (_heads(F.linear(x, w), num_heads) for w in (w_q, w_k, w_v))  # (B, H, T, ·)
    positions = torch.arange(x.shape[1])
    heads = F.scaled_dot_product_attention(_rotate(q, positions, theta), _rotate(k, positions, theta), v,
                                           is_causal=True)
    return F.linear(heads.transpose(1, 2).flatten(-2), w_o)
