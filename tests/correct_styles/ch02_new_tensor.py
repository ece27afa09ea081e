"""Chapter 2 building its masks on the CPU and handing them to the inputs' device.

The student who finds masks easiest to write as Python lists: the mask is
computed on the host from ``lengths.tolist()``, then moved to the inputs with
``lengths.new_tensor(...)`` or ``torch.empty(..., device=x.device).copy_(...)``.
Every other new tensor comes from an input (``new_zeros``, ``new_full``,
``new_ones``), so it has the input's device without naming it.
"""

import math

import torch

MASK_CONVENTIONS = ("attend", "block", "additive")


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    sizes = lengths.tolist()
    if max_len is None:
        max_len = max(sizes, default=0)
    rows = [[s < n for s in range(max_len)] for n in sizes]
    host = torch.tensor(rows, dtype=torch.bool).reshape(len(sizes), max_len)  # (B, S) on the CPU
    # new_tensor copies the host mask onto lengths' device; the dtype must be asked for
    return lengths.new_tensor(host, dtype=torch.bool)


def convert_mask(mask, source, target, dtype=torch.float32):
    known = set(MASK_CONVENTIONS)
    if source not in known:
        raise ValueError(f"unknown source convention {source!r}")
    if target not in known:
        raise ValueError(f"unknown target convention {target!r}")
    if source == target and source != "additive":
        return mask.clone()
    if source == "attend":
        attend = mask
    elif source == "block":
        attend = mask.logical_not()
    else:
        attend = mask != mask.new_tensor(float("-inf"))
    if target == "attend":
        return attend
    if target == "block":
        return attend.logical_not()
    additive = attend.new_full(attend.shape, float("-inf"), dtype=dtype)
    return additive.masked_fill(attend, 0.0)


def combine_masks(key_padding, attn_mask=None):
    batch, keys = key_padding.shape
    if attn_mask is None:
        attn_mask = key_padding.new_ones((1, 1))  # allows everything, broadcasts over (L, S)
    if attn_mask.dim() == 2:
        attn_mask = attn_mask[None]  # (1, L, S)
    return key_padding.view(batch, 1, 1, keys) & attn_mask[:, None]  # (B, 1, L, S)


def cross_attention(x, context, w_q, w_k, w_v, context_lengths=None):
    q = x @ w_q.transpose(0, 1)  # (B, L, d_k)
    k = context @ w_k.transpose(0, 1)  # (B, S, d_k)
    v = context @ w_v.transpose(0, 1)  # (B, S, d_v)
    scores = (q @ k.transpose(1, 2)) * q.new_tensor(1 / math.sqrt(q.shape[-1]))  # (B, L, S)
    if context_lengths is None:
        weights = torch.softmax(scores, dim=-1)
        return weights @ v, weights
    batch, keys = context.shape[0], context.shape[1]
    host = torch.zeros(batch, keys, dtype=torch.bool)  # built on the CPU, row by row
    for b, n in enumerate(context_lengths.tolist()):
        host[b, :n] = True
    real = torch.empty(batch, keys, dtype=torch.bool, device=x.device).copy_(host)  # (B, S)
    has_keys = real.any(dim=-1)[:, None, None]  # (B, 1, 1)
    scores = scores.masked_fill(~real[:, None, :], float("-inf"))
    scores = torch.where(has_keys, scores, scores.new_zeros(()))
    weights = torch.softmax(scores, dim=-1) * has_keys  # (B, L, S)
    return weights @ v, weights
