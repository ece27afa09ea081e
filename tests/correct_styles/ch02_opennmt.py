"""Chapter 2 in the style of OpenNMT-py.

OpenNMT's ``sequence_mask`` builds the padding mask from
``torch.arange(0, max_len).type_as(lengths).repeat(batch, 1).lt(lengths.unsqueeze(1))``
(``type_as`` puts the positions on the lengths' device and dtype), and its
``GlobalAttention`` scores with ``torch.bmm``, hides padding with the
"block" convention (``~sequence_mask``) and an in-place ``masked_fill_``.
Tensor methods (``.lt``, ``.eq``, ``.logical_and``) rather than operators.
"""

import math

import torch
import torch.nn.functional as F

MASK_CONVENTIONS = ("attend", "block", "additive")


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    batch_size = lengths.numel()
    if max_len is None:
        max_len = lengths.max().item() if batch_size > 0 else 0
    return (torch.arange(0, max_len)
            .type_as(lengths)
            .repeat(batch_size, 1)
            .lt(lengths.unsqueeze(1)))


def convert_mask(mask, source, target, dtype=torch.float32):
    if source not in MASK_CONVENTIONS or target not in MASK_CONVENTIONS:
        raise ValueError(f"mask conventions are {MASK_CONVENTIONS}, got {source!r} -> {target!r}")
    if source == "block":
        attend = mask.logical_not()
    elif source == "additive":
        attend = mask.ne(float("-inf"))
    else:
        attend = mask
    if target == "attend":
        return attend
    if target == "block":
        return attend.logical_not()
    return torch.zeros_like(attend, dtype=dtype).masked_fill_(attend.logical_not(), -float("inf"))


def combine_masks(key_padding, attn_mask=None):
    mask = key_padding.unsqueeze(1).unsqueeze(1)  # (B, 1, 1, S)
    if attn_mask is None:
        return mask
    if attn_mask.dim() == 2:
        attn_mask = attn_mask.unsqueeze(0)  # (1, L, S)
    return mask.logical_and(attn_mask.unsqueeze(1))  # (B, 1, L, S)


def cross_attention(x, context, w_q, w_k, w_v, context_lengths=None):
    h_t = F.linear(x, w_q)  # (B, L, d_k)
    h_s = F.linear(context, w_k)  # (B, S, d_k)
    values = F.linear(context, w_v)  # (B, S, d_v)
    align = torch.bmm(h_t, h_s.transpose(1, 2)) / math.sqrt(h_t.size(2))  # (B, L, S)
    if context_lengths is not None:
        pad = ~padding_mask(context_lengths, max_len=align.size(-1))  # (B, S), True at padding
        pad = pad.unsqueeze(1)  # (B, 1, S)
        align.masked_fill_(pad, -float("inf"))
        # an empty context would leave a row of -inf; those rows come out as 0
        empty = pad.all(dim=-1, keepdim=True)  # (B, 1, 1)
        align.masked_fill_(empty, 0.0)
        align_vectors = F.softmax(align, dim=-1).masked_fill(empty, 0.0)
    else:
        align_vectors = F.softmax(align, dim=-1)
    c = torch.bmm(align_vectors, values)  # (B, L, d_v)
    return c, align_vectors
