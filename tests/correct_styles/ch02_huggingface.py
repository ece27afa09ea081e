"""Chapter 2 in the style of Hugging Face ``transformers``.

Habits from ``transformers``: the padding mask is "expanded" from ``(B, S)``
to ``(B, 1, L, S)`` and inverted into an additive mask holding
``torch.finfo(dtype).min`` at padding (as ``_prepare_4d_attention_mask``
does), the softmax is ``nn.functional.softmax(..., dtype=torch.float32)``
cast back with ``.to(query.dtype)``, and projections are
``nn.functional.linear``. convert_mask still writes exactly -inf, as its
docstring asks; finfo.min is only used inside attention, where a sequence
with an empty context is given a zero mask and then zero weights.
"""


import torch
from torch import nn

MASK_CONVENTIONS = ("attend", "block", "additive")


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    if max_len is None:
        max_len = lengths.max().item() if lengths.shape[0] else 0
    range_tensor = torch.arange(max_len, device=lengths.device).unsqueeze(0)  # (1, S)
    range_tensor = range_tensor.expand(lengths.shape[0], -1)  # (B, S)
    return range_tensor < lengths.unsqueeze(-1)


def convert_mask(mask, source, target, dtype=torch.float32):
    if source not in MASK_CONVENTIONS:
        raise ValueError(f"`source` has to be one of {MASK_CONVENTIONS}, but is {source}")
    if target not in MASK_CONVENTIONS:
        raise ValueError(f"`target` has to be one of {MASK_CONVENTIONS}, but is {target}")
    if source == "attend":
        attend = mask.to(torch.bool)
    elif source == "block":
        attend = ~mask.to(torch.bool)
    else:
        attend = mask != float("-inf")
    if target == "attend":
        return attend
    if target == "block":
        return ~attend
    inverted = 1.0 - attend.to(dtype)  # 1.0 where blocked
    return inverted.masked_fill(inverted.to(torch.bool), float("-inf"))


def combine_masks(key_padding, attn_mask=None):
    bsz, src_len = key_padding.size()
    tgt_len = 1 if attn_mask is None else attn_mask.size(-2)
    expanded = key_padding[:, None, None, :].expand(bsz, 1, tgt_len, src_len)
    if attn_mask is None:
        return expanded
    if attn_mask.dim() == 2:
        attn_mask = attn_mask[None, None, :, :]
    else:
        attn_mask = attn_mask[:, None, :, :]
    return expanded & attn_mask


def _prepare_attention_mask(lengths, dtype, tgt_len, src_len):
    """(B, 1, L, S) additive: 0 at real keys, finfo(dtype).min at padding."""
    expanded_mask = padding_mask(lengths, src_len)[:, None, None, :]
    expanded_mask = expanded_mask.expand(lengths.shape[0], 1, tgt_len, src_len).to(dtype)
    inverted_mask = 1.0 - expanded_mask
    return inverted_mask.masked_fill(inverted_mask.to(torch.bool), torch.finfo(dtype).min)


def cross_attention(x, context, w_q, w_k, w_v, context_lengths=None):
    query_states = nn.functional.linear(x, w_q)
    key_states = nn.functional.linear(context, w_k)
    value_states = nn.functional.linear(context, w_v)
    scaling = query_states.size(-1) ** -0.5

    attn_weights = torch.matmul(query_states, key_states.transpose(1, 2)) * scaling  # (B, L, S)
    has_context = None
    if context_lengths is not None:
        tgt_len, src_len = attn_weights.shape[-2:]
        attention_mask = _prepare_attention_mask(context_lengths, attn_weights.dtype, tgt_len, src_len)
        has_context = (context_lengths > 0)[:, None, None]  # (B, 1, 1)
        # an empty context: mask nothing here, zero the weights after the softmax
        attention_mask = attention_mask[:, 0].masked_fill(~has_context, 0.0)  # (B, L, S)
        attn_weights = attn_weights + attention_mask

    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
    if has_context is not None:
        attn_weights = attn_weights.masked_fill(~has_context, 0.0)
    attn_output = torch.matmul(attn_weights, value_states)  # (B, L, d_v)
    return attn_output, attn_weights
