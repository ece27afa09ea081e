"""Chapter 10 in the style of Hugging Face transformers.

The style of a student who read ``masking_utils.py`` and the GPT-J model:
the mask is ``and_masks``/``or_masks`` of index functions
(``causal_mask_function``, ``sliding_window_overlay``: ``kv_idx > q_idx -
sliding_window``, a sink overlay) evaluated on broadcast index tensors;
``position_ids`` within the cache come from ranking the held tokens' text
positions (``argsort`` of ``argsort``); RoPE is GPT-J's
``rotate_every_two`` with ``repeat_interleave``d sin and cos; the mask is
additive, ``torch.finfo(dtype).min`` where a slot is empty, and the softmax
runs in float32 (``dtype=torch.float32``) before ``.to(query.dtype)``.
"""

import torch
from torch import nn


def and_masks(*mask_functions):
    def and_mask(q_idx, kv_idx):
        result = torch.ones((), dtype=torch.bool, device=q_idx.device)
        for mask in mask_functions:
            result = result & mask(q_idx, kv_idx)
        return result
    return and_mask


def or_masks(*mask_functions):
    def or_mask(q_idx, kv_idx):
        result = torch.zeros((), dtype=torch.bool, device=q_idx.device)
        for mask in mask_functions:
            result = result | mask(q_idx, kv_idx)
        return result
    return or_mask


def causal_mask_function(q_idx, kv_idx):
    return kv_idx <= q_idx


def sliding_window_overlay(sliding_window):
    def inner_mask(q_idx, kv_idx):
        return kv_idx > q_idx - sliding_window
    return inner_mask


def sink_overlay(num_sink_tokens):
    def inner_mask(q_idx, kv_idx):
        return kv_idx < num_sink_tokens
    return inner_mask


def sliding_window_mask(query_len, key_len, window, sinks=0, device=None):
    mask_function = and_masks(causal_mask_function, or_masks(sliding_window_overlay(window), sink_overlay(sinks)))
    q_idx = torch.arange(key_len - query_len, key_len, device=device)[:, None]
    kv_idx = torch.arange(key_len, device=device)[None, :]
    return mask_function(q_idx, kv_idx).expand(query_len, key_len)


def rolling_cache_append(k_cache, v_cache, k_new, v_new, count, sinks=0):
    window_length = k_cache.shape[-2] - sinks
    slot = count if count < sinks else sinks + (count - sinks) % window_length
    keep = torch.ones(k_cache.shape[-2], dtype=torch.bool, device=k_cache.device)
    keep[slot] = False
    keep = keep[:, None]  # (C, 1)
    return (torch.where(keep, k_cache, k_new.expand_as(k_cache)),
            torch.where(keep, v_cache, v_new.expand_as(v_cache)))


def rotate_every_two(x):
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)


def apply_rotary_pos_emb(tensor, sin, cos):
    sin = torch.repeat_interleave(sin[None, None, :, :], 2, 3)
    cos = torch.repeat_interleave(cos[None, None, :, :], 2, 3)
    return (tensor * cos) + (rotate_every_two(tensor) * sin)


def create_sinusoidal_positions(position_ids, dim, base):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device=position_ids.device).float() / dim))
    sinusoid_inp = position_ids.float()[:, None] * inv_freq[None, :]
    return torch.sin(sinusoid_inp), torch.cos(sinusoid_inp)


def streaming_attention_step(x_new, num_heads, w_q, w_k, w_v, w_o, k_cache, v_cache, count, sinks=0,
                             theta=10000.0):
    q_proj, k_proj, v_proj, out_proj = (nn.functional.linear for _ in range(4))
    bsz = x_new.shape[0]
    head_dim = w_q.shape[0] // num_heads
    query_states = q_proj(x_new, w_q).view(bsz, 1, num_heads, head_dim).transpose(1, 2)
    key_states = k_proj(x_new, w_k).view(bsz, 1, num_heads, head_dim).transpose(1, 2)
    value_states = v_proj(x_new, w_v).view(bsz, 1, num_heads, -1).transpose(1, 2)
    k_cache, v_cache = rolling_cache_append(k_cache, v_cache, key_states, value_states, count, sinks)

    capacity = k_cache.shape[-2]
    slots = torch.arange(capacity, device=x_new.device)
    window_length = capacity - sinks
    # The text position of the token last written to each slot; empty slots get a large one.
    text = torch.where(slots < sinks, slots, count - torch.remainder(count - slots, window_length))
    written = slots <= count
    text = torch.where(written, text - count, torch.ones_like(text))  # relative to now: <= 0, empty slots 1
    position_ids = torch.argsort(torch.argsort(text))  # rank among the slots, in text order
    key_states = k_cache
    if theta is not None:
        sin, cos = create_sinusoidal_positions(position_ids, head_dim, theta)
        key_states = apply_rotary_pos_emb(k_cache, sin.to(k_cache.dtype), cos.to(k_cache.dtype))
        query_at = written.sum(dim=0, keepdim=True) - 1  # n - 1
        sin, cos = create_sinusoidal_positions(query_at, head_dim, theta)
        query_states = apply_rotary_pos_emb(query_states, sin.to(k_cache.dtype), cos.to(k_cache.dtype))

    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / head_dim**0.5
    causal_mask = torch.zeros(capacity, dtype=attn_weights.dtype, device=attn_weights.device)
    causal_mask = causal_mask.masked_fill(~written, torch.finfo(attn_weights.dtype).min)
    attn_weights = attn_weights + causal_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
    attn_output = torch.matmul(attn_weights, v_cache)
    attn_output = attn_output.transpose(1, 2).reshape(bsz, 1, -1)
    return out_proj(attn_output, w_o), (k_cache, v_cache)
