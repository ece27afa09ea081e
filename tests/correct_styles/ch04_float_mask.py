"""Chapter 4 with 0/1 float masks, computed in float64.

The style of a student who thinks of masks as matrices of ones and zeros:
``torch.tril(torch.ones(T, T)).type_as(x)`` (made on the CPU, then given the
type, hence the device, of the data), ``.to(x)`` and ``.to(lengths)`` to
bring helper tensors next to their inputs, masks multiplied together and
tested with ``mask == 0``. Careful about precision, the student runs the
attention itself in float64 (``x.double()``) and casts the output back to
the input's dtype at the end; the KV cache stays in the dtype of the inputs.
"""

import math

import torch


def causal_mask(num_queries, num_keys=None, device=None):
    num_keys = num_queries if num_keys is None else num_keys
    ones = torch.ones(num_queries, num_keys)
    return torch.tril(ones, diagonal=num_keys - num_queries).to(device=device, dtype=torch.bool)


def _heads(t, num_heads):
    b, n, _ = t.shape
    return t.reshape(b, n, num_heads, -1).transpose(1, 2)  # (B, H, T, d)


def _attention64(q, k, v, mask):
    """q, k, v in any float dtype, mask of 1.0 (may attend) and 0.0; float64 result."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(mask == 0, float("-inf"))
    nothing = mask.sum(dim=-1, keepdim=True) == 0  # a query with no key
    weights = torch.softmax(scores.masked_fill(nothing, 0.0), dim=-1).masked_fill(nothing, 0.0)
    return weights @ v  # (B, H, L, d_v), float64


def causal_self_attention(x, num_heads, w_q, w_k, w_v, w_o, lengths=None):
    b, n, _ = x.shape
    q, k, v = (_heads(x @ w.t(), num_heads) for w in (w_q, w_k, w_v))
    mask = torch.tril(torch.ones(n, n)).type_as(x)  # (T, T) of 1.0 and 0.0
    if lengths is not None:
        real = (torch.arange(n).to(lengths)[None, :] < lengths[:, None]).to(x)  # (B, T) of 1.0 and 0.0
        mask = mask * real[:, None, None, :]  # (B, 1, T, T)
    out = _attention64(q, k, v, mask)
    out = out.transpose(1, 2).reshape(b, n, -1)  # (B, T, D_v)
    return (out @ w_o.double().t()).to(x.dtype)


def attend_with_cache(x_new, num_heads, w_q, w_k, w_v, w_o, cache=None):
    b, n, _ = x_new.shape
    q, k, v = (_heads(x_new @ w.t(), num_heads) for w in (w_q, w_k, w_v))
    if cache is not None:
        k = torch.cat([cache[0], k], dim=-2)
        v = torch.cat([cache[1], v], dim=-2)
    past = k.shape[-2] - n
    mask = torch.tril(torch.ones(n, past + n), diagonal=past).type_as(x_new)  # (T_new, S)
    out = _attention64(q, k, v, mask).transpose(1, 2).reshape(b, n, -1)
    return (out @ w_o.double().t()).to(x_new.dtype), (k, v)
