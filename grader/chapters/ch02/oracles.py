"""Chapter 2's oracles: padding masks written as loops, masks in each
convention, PyTorch's attention one sequence at a time, and
``nn.MultiheadAttention`` run on each sequence's real keys alone.

Shapes: lengths ``(B,)`` int64; a padding mask ``(B, S)``, True at real
tokens; attn_mask ``(L, S)`` or ``(B, L, S)``, True = may attend; x
``(B, L, d_x)``, context ``(B, S, d_c)``; projection weights ``(d_out, d_in)``
as ``F.linear`` takes them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grader.oracles import attention, gradients

__all__ = ["attention", "causal_mask", "cross_attention", "cross_attention_gradients", "mask_in_convention",
           "multihead_attention_over_real_keys", "padding_mask", "per_sequence_attention"]


def padding_mask(lengths, max_len):
    """The padding mask written as a loop, one position at a time: ``(B, max_len)``."""
    mask = torch.zeros(len(lengths), max_len, dtype=torch.bool)
    for b, length in enumerate(lengths.tolist()):
        for s in range(max_len):
            mask[b, s] = s < length
    return mask


def mask_in_convention(attend, convention, biases):
    """``attend`` (True = may attend) written in ``convention``. An additive
    mask keeps its keys with the finite ``biases`` (same shape), not only with 0."""
    if convention == "attend":
        return attend.clone()
    if convention == "block":
        return ~attend
    return biases.masked_fill(~attend, float("-inf"))


def causal_mask(queries, keys):
    """``(L, S)``, True where query i may attend to key j: the last query sees
    every key, the causal mask aligned bottom-right."""
    return torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)


def per_sequence_attention(q, k, v, key_padding, attn_mask):
    """``F.scaled_dot_product_attention`` for each sequence on its own, with
    an ``(L, S)`` mask built for it. q ``(B, H, L, d)``, k ``(B, H, S, d)``,
    v ``(B, H, S, d_v)``, key_padding ``(B, S)``; ``(B, H, L, d_v)``."""
    outputs = []
    for b in range(q.shape[0]):
        allowed = key_padding[b].expand(q.shape[-2], -1)  # (L, S)
        if attn_mask is not None:
            allowed = allowed & (attn_mask if attn_mask.dim() == 2 else attn_mask[b])
        outputs.append(F.scaled_dot_product_attention(q[b], k[b], v[b], attn_mask=allowed))  # (H, L, d_v)
    return torch.stack(outputs)  # (B, H, L, d_v)


def multihead_attention_over_real_keys(state, num_heads, query, context, lengths):
    """The output of an ``nn.MultiheadAttention`` (batch first, eval mode)
    holding ``state`` (its own parameter names), run on each sequence's real
    keys alone, with no mask at all. query ``(B, L, E)``, context ``(B, S, E)``;
    ``(B, L, E)``."""
    width = query.shape[-1]
    module = torch.nn.MultiheadAttention(width, num_heads, batch_first=True, dtype=query.dtype)
    module.load_state_dict(state)
    module.eval()
    with torch.no_grad():
        return torch.stack([module(query[b:b + 1], context[b:b + 1, :n], context[b:b + 1, :n])[0][0]
                            for b, n in enumerate(lengths.tolist())])


def cross_attention(x, context, w_q, w_k, w_v, context_lengths=None):
    """``(output, weights)``: ``F.linear`` for the projections, PyTorch's
    attention with a ``(B, 1, S)`` mask of the real keys."""
    mask = None
    if context_lengths is not None:
        mask = padding_mask(context_lengths, context.shape[-2])[:, None, :]  # (B, 1, S)
    return attention(F.linear(x, w_q), F.linear(context, w_k), F.linear(context, w_v), mask)


def cross_attention_gradients(x, context, w_q, w_k, w_v, context_lengths, upstream):
    """Gradients of ``<cross_attention(...) output, upstream>`` with respect
    to x, context and the three weights."""
    return gradients(lambda *t: cross_attention(*t, context_lengths)[0], [x, context, w_q, w_k, w_v],
                     [0, 1, 2, 3, 4], upstream)
