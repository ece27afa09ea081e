"""Chapter 2 in the style of Meta's llama reference code.

As in llama's ``Attention.forward``: projections through ``F.linear`` (as
``self.wq(x)``), scores from ``torch.matmul(xq, keys.transpose(1, 2)) /
math.sqrt(head_dim)``, an additive mask built with ``torch.full(...,
float("-inf"), device=...)`` and added to the scores, and the softmax taken
in float32 and cast back: ``F.softmax(scores.float(), dim=-1).type_as(xq)``.
"""

import math

import torch
import torch.nn.functional as F

MASK_CONVENTIONS = ("attend", "block", "additive")


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    if max_len is None:
        max_len = int(lengths.max()) if len(lengths) > 0 else 0
    positions = torch.arange(max_len, device=lengths.device)
    return positions[None, :] < lengths[:, None]  # (B, S)


def convert_mask(mask, source, target, dtype=torch.float32):
    if source not in MASK_CONVENTIONS:
        raise ValueError(f"source must be one of {MASK_CONVENTIONS}, not {source!r}")
    if target not in MASK_CONVENTIONS:
        raise ValueError(f"target must be one of {MASK_CONVENTIONS}, not {target!r}")
    attend = {"attend": lambda m: m, "block": lambda m: ~m,
              "additive": lambda m: ~torch.isneginf(m)}[source](mask)
    if target == "attend":
        return attend
    if target == "block":
        return ~attend
    blocked = torch.full(attend.shape, float("-inf"), dtype=dtype, device=attend.device)
    return torch.where(attend, torch.zeros_like(blocked), blocked)


def combine_masks(key_padding, attn_mask=None):
    mask = key_padding[:, None, None, :]  # (B, 1, 1, S)
    if attn_mask is not None:
        attn_mask = attn_mask.reshape(-1, 1, *attn_mask.shape[-2:])  # (B or 1, 1, L, S)
        mask = torch.logical_and(mask, attn_mask)
    return mask


def cross_attention(x, context, w_q, w_k, w_v, context_lengths=None):
    xq = F.linear(x, w_q)
    keys = F.linear(context, w_k)
    values = F.linear(context, w_v)
    head_dim = xq.shape[-1]
    scores = torch.matmul(xq, keys.transpose(1, 2)) / math.sqrt(head_dim)  # (B, L, S)
    empty = None
    if context_lengths is not None:
        bsz, seqlen = context.shape[0], context.shape[1]
        mask = torch.full((bsz, 1, seqlen), float("-inf"), device=x.device)
        mask = mask.masked_fill(padding_mask(context_lengths, seqlen)[:, None, :], 0.0)
        # a sequence with no context at all: no -inf for it, its weights are zeroed below
        empty = (context_lengths == 0)[:, None, None]  # (B, 1, 1)
        mask = mask.masked_fill(empty, 0.0)
        scores = scores + mask
    scores = F.softmax(scores.float(), dim=-1).type_as(xq)
    if empty is not None:
        scores = scores.masked_fill(empty, 0.0)
    output = torch.matmul(scores, values)  # (B, L, d_v)
    return output, scores
