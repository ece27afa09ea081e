"""Chapter 10 in the style of Mistral's reference code (mistral-src).

The style of a student who read Mistral 7B's ``RotatingBufferCache``: a
token's slot is ``position % sliding_window`` (here offset by the sinks),
written with ``index_copy`` on a clone; at a step the ring is "unrotated",
``torch.roll`` back into text order, so that the buffer reads oldest to
newest; positions are then ``arange(n)`` and RoPE is Meta's complex
``freqs_cis`` (``torch.polar``, ``view_as_complex``). The mask is a band
built from index differences, as xformers' local attention masks are, and
attention goes through ``F.scaled_dot_product_attention`` with a bool mask.
"""

import torch
import torch.nn.functional as F


def sliding_window_mask(query_len, key_len, window, sinks=0, device=None):
    offset = key_len - query_len
    q_pos = torch.arange(offset, offset + query_len, device=device).unsqueeze(1)
    k_pos = torch.arange(key_len, device=device).unsqueeze(0)
    distance = q_pos - k_pos  # how far back each key is
    band = (distance >= 0) & (distance < window)
    return band | ((k_pos < sinks) & (distance >= 0))


def _cache_position(count, capacity, sinks):
    if count < sinks:
        return count
    sliding_window = capacity - sinks
    return sinks + (count - sinks) % sliding_window


def rolling_cache_append(k_cache, v_cache, k_new, v_new, count, sinks=0):
    index = torch.tensor([_cache_position(count, k_cache.shape[2], sinks)], device=k_cache.device)
    return k_cache.index_copy(2, index, k_new), v_cache.index_copy(2, index, v_new)


def _freqs_cis(dim, positions, theta):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device)[: dim // 2].float() / dim))
    freqs = torch.outer(positions.float(), freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def _apply_rotary_emb(x, freqs_cis):
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * freqs_cis).flatten(-2).type_as(x)


def _unrotate(cache, count, sinks):
    """The buffer in text order: the sinks, then the ring from its oldest token."""
    capacity = cache.shape[2]
    if count < capacity:  # not full yet: slots 0 .. count in order
        return cache[:, :, : count + 1]
    sliding_window = capacity - sinks
    oldest = (count + 1 - sinks) % sliding_window
    ring = torch.roll(cache[:, :, sinks:], shifts=-oldest, dims=2)
    return torch.cat([cache[:, :, :sinks], ring], dim=2)


def streaming_attention_step(x_new, num_heads, w_q, w_k, w_v, w_o, k_cache, v_cache, count, sinks=0,
                             theta=10000.0):
    bsz, seqlen, _ = x_new.shape
    xq, xk, xv = F.linear(x_new, w_q), F.linear(x_new, w_k), F.linear(x_new, w_v)
    head_dim = xq.shape[-1] // num_heads
    xq = xq.view(bsz, seqlen, num_heads, head_dim).transpose(1, 2)
    xk = xk.view(bsz, seqlen, num_heads, head_dim).transpose(1, 2)
    xv = xv.view(bsz, seqlen, num_heads, -1).transpose(1, 2)
    k_cache, v_cache = rolling_cache_append(k_cache, v_cache, xk, xv, count, sinks)
    keys, values = _unrotate(k_cache, count, sinks), _unrotate(v_cache, count, sinks)
    n = keys.shape[2]
    if theta is not None:
        positions = torch.arange(n, device=x_new.device)
        freqs_cis = _freqs_cis(head_dim, positions, theta)
        keys = _apply_rotary_emb(keys, freqs_cis)
        xq = _apply_rotary_emb(xq, freqs_cis[-1:])
    output = F.scaled_dot_product_attention(xq, keys, values)
    output = output.transpose(1, 2).reshape(bsz, seqlen, -1)
    return F.linear(output, w_o), (k_cache, v_cache)
