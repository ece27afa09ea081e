"""Chapter 4 with masks built once and cached, as serving code does.

The style of code that builds a mask once per shape and device: a
TorchScript function makes the triangle (``torch.jit.script``), an
``functools.lru_cache`` keyed by the lengths and the device keeps it, and
every later call returns the cached tensor, made in an earlier call. The
cached step returns named tuples (``StepOutput(output, KVCache(k, v))``),
as Hugging Face's model outputs do.
"""

import functools
import math
from typing import NamedTuple

import torch


class KVCache(NamedTuple):
    keys: torch.Tensor  # (B, H, T, d)
    values: torch.Tensor  # (B, H, T, d_v)


class StepOutput(NamedTuple):
    output: torch.Tensor  # (B, T_new, d_out)
    cache: KVCache


@torch.jit.script
def _visible(num_queries: int, num_keys: int, device: torch.device) -> torch.Tensor:
    """True where query i (at position i + S - L) may see key j."""
    rows = torch.arange(num_queries, device=device).unsqueeze(1) + (num_keys - num_queries)  # (L, 1)
    cols = torch.arange(num_keys, device=device).unsqueeze(0)  # (1, S)
    return cols <= rows  # (L, S)


@functools.lru_cache(maxsize=64)
def _cached_mask(num_queries: int, num_keys: int, device: torch.device) -> torch.Tensor:
    return _visible(num_queries, num_keys, device)


def causal_mask(num_queries, num_keys=None, device=None):
    num_keys = num_queries if num_keys is None else num_keys
    return _cached_mask(num_queries, num_keys, torch.device(device if device is not None else "cpu"))


def _heads(x, weight, num_heads):
    batch, length, _ = x.shape
    return (x @ weight.T).view(batch, length, num_heads, -1).transpose(1, 2)  # (B, H, T, d)


def _attend(q, k, v, mask):
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, L, S)
    scores = scores.masked_fill(~mask, float("-inf"))
    empty = ~mask.any(dim=-1, keepdim=True)  # queries that see no key
    weights = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return weights @ v  # (B, H, L, d_v)


def causal_self_attention(x, num_heads, w_q, w_k, w_v, w_o, lengths=None):
    batch, length, _ = x.shape
    q, k, v = (_heads(x, w, num_heads) for w in (w_q, w_k, w_v))
    mask = causal_mask(length, device=x.device)  # (T, T), cached after the first call
    if lengths is not None:
        real = torch.arange(length, device=x.device) < lengths[:, None]  # (B, T)
        mask = mask & real[:, None, None, :]  # (B, 1, T, T)
    heads = _attend(q, k, v, mask)
    return heads.transpose(1, 2).reshape(batch, length, -1) @ w_o.T  # (B, T, d_out)


def attend_with_cache(x_new, num_heads, w_q, w_k, w_v, w_o, cache=None):
    batch, length, _ = x_new.shape
    q, k, v = (_heads(x_new, w, num_heads) for w in (w_q, w_k, w_v))
    if cache is not None:
        past = KVCache(*cache)
        k = torch.cat([past.keys, k], dim=2)  # (B, H, T_past + T_new, d)
        v = torch.cat([past.values, v], dim=2)
    heads = _attend(q, k, v, causal_mask(length, k.shape[-2], device=x_new.device))
    output = heads.transpose(1, 2).reshape(batch, length, -1) @ w_o.T
    return StepOutput(output, KVCache(k, v))
