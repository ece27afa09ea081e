"""Chapter 2 with einsum and ``with torch.device(...)`` blocks.

Index notation for every product (``"bld,bsd->bls"``), masks combined with
broadcasting ``torch.where`` / ``torch.logical_and``, and factory calls
written inside ``with torch.device(lengths.device):`` so that they land on
the inputs' device without a ``device=`` on each call (PyTorch >= 2.0).
The empty-context case is handled by giving such rows a harmless score and
then zeroing their weights.
"""

import math

import torch

MASK_CONVENTIONS = ("attend", "block", "additive")


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    if max_len is None:
        max_len = int(lengths.amax()) if lengths.numel() else 0
    with torch.device(lengths.device):
        positions = torch.arange(max_len)  # (S,)
    return torch.lt(positions.unsqueeze(0), lengths.unsqueeze(1))  # (B, S)


def convert_mask(mask, source, target, dtype=torch.float32):
    if {source, target} - set(MASK_CONVENTIONS):
        raise ValueError(f"unknown mask convention in {(source, target)}; known: {MASK_CONVENTIONS}")
    readers = {
        "attend": lambda m: m.bool(),
        "block": lambda m: m.logical_not(),
        "additive": lambda m: torch.isneginf(m).logical_not(),
    }
    attend = readers[source](mask)
    if target == "attend":
        return attend
    if target == "block":
        return attend.logical_not()
    with torch.device(mask.device):
        zero = torch.zeros((), dtype=dtype)
        minus_inf = torch.full((), float("-inf"), dtype=dtype)
    return torch.where(attend, zero, minus_inf)


def combine_masks(key_padding, attn_mask=None):
    batch, keys = key_padding.shape
    combined = key_padding.reshape(batch, 1, 1, keys)
    if attn_mask is not None:
        queries = attn_mask.shape[-2]
        combined = torch.logical_and(combined, attn_mask.reshape(-1, 1, queries, keys))
    return combined


def cross_attention(x, context, w_q, w_k, w_v, context_lengths=None):
    q = torch.einsum("blx,kx->blk", x, w_q)
    k = torch.einsum("bsc,kc->bsk", context, w_k)
    v = torch.einsum("bsc,vc->bsv", context, w_v)
    scores = torch.einsum("blk,bsk->bls", q, k) / math.sqrt(q.shape[-1])
    if context_lengths is None:
        weights = scores.softmax(dim=-1)
        return torch.einsum("bls,bsv->blv", weights, v), weights
    real = padding_mask(context_lengths, context.shape[1])  # (B, S)
    nonempty = real.any(dim=-1).view(-1, 1, 1)  # (B, 1, 1)
    visible = real.unsqueeze(1) | ~nonempty  # an empty context sees everything, then is zeroed
    scores = torch.where(visible, scores, float("-inf"))
    weights = torch.where(nonempty, scores.softmax(dim=-1), 0.0)
    return torch.einsum("bls,bsv->blv", weights, v), weights
