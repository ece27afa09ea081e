"""Chapter 4 after the Annotated Transformer (Harvard NLP) and OpenNMT.

The style of a student who learnt decoding from "The Annotated Transformer":
the causal mask is ``subsequent_mask(size)``, built on the CPU as
``triu(ones(1, size, size)).type(torch.uint8) == 0``, then moved next to the
data with ``.type_as(...)`` (``tgt_mask & subsequent_mask(T).type_as(tgt_mask)``);
padding comes from OpenNMT's ``sequence_mask``
(``arange(0, max_len).type_as(lengths).repeat(batch, 1).lt(lengths.unsqueeze(1))``);
the maths sits in a free ``attention()`` that tests ``mask == 0`` (so a 0/1
float mask works as well as a bool one) and returns ``(output, p_attn)``;
heads use ``view(nbatches, -1, h, d_k).transpose(1, 2)``. The mask is
aligned bottom-right by an offset on ``triu``'s diagonal, and filled with
-inf rather than the original's -1e9, which float16 cannot hold; a query
with no key gets zeros.
"""

import math

import torch


def subsequent_mask(size, num_keys=None):
    "Mask out subsequent positions (the last `size` of `num_keys` tokens)."
    num_keys = size if num_keys is None else num_keys
    attn_shape = (1, size, num_keys)
    subsequent = torch.triu(torch.ones(attn_shape), diagonal=num_keys - size + 1).type(torch.uint8)
    return subsequent == 0


def sequence_mask(lengths, max_len=None):
    "Creates a boolean mask from sequence lengths."
    batch_size = lengths.numel()
    max_len = max_len or lengths.max()
    return (torch.arange(0, max_len)
            .type_as(lengths)
            .repeat(batch_size, 1)
            .lt(lengths.unsqueeze(1)))


def attention(query, key, value, mask=None):
    "Compute 'Scaled Dot Product Attention'"
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    empty = torch.isinf(scores).all(dim=-1, keepdim=True)  # a query with no key at all
    p_attn = scores.masked_fill(empty, 0.0).softmax(dim=-1).masked_fill(empty, 0.0)
    return torch.matmul(p_attn, value), p_attn


def causal_mask(num_queries, num_keys=None, device=None):
    mask = subsequent_mask(num_queries, num_keys)[0]  # (L, S)
    return mask if device is None else mask.to(device)


def _heads(x, w, h):
    nbatches = x.size(0)
    return (x @ w.t()).view(nbatches, -1, h, w.size(0) // h).transpose(1, 2)  # (B, h, T, d_k)


def causal_self_attention(x, num_heads, w_q, w_k, w_v, w_o, lengths=None):
    nbatches, size = x.size(0), x.size(1)
    query, key, value = [_heads(x, w, num_heads) for w in (w_q, w_k, w_v)]
    if lengths is not None:
        tgt_mask = sequence_mask(lengths, size).unsqueeze(-2)  # (B, 1, T): real keys
        tgt_mask = tgt_mask & subsequent_mask(size).type_as(tgt_mask)  # (B, T, T)
    else:
        tgt_mask = subsequent_mask(size).type_as(x)  # (1, T, T) of 1.0 / 0.0
    # Same mask applied to all h heads.
    tgt_mask = tgt_mask.unsqueeze(1)
    out, _ = attention(query, key, value, mask=tgt_mask)
    out = out.transpose(1, 2).contiguous().view(nbatches, -1, out.size(1) * out.size(-1))
    return out @ w_o.t()


def attend_with_cache(x_new, num_heads, w_q, w_k, w_v, w_o, cache=None):
    nbatches, size = x_new.size(0), x_new.size(1)
    query, key, value = [_heads(x_new, w, num_heads) for w in (w_q, w_k, w_v)]
    if cache is not None:
        past_key, past_value = cache
        key = torch.cat([past_key, key], dim=2)
        value = torch.cat([past_value, value], dim=2)
    mask = subsequent_mask(size, key.size(2)).type_as(x_new).unsqueeze(1)  # (1, 1, T_new, S)
    out, _ = attention(query, key, value, mask=mask)
    out = out.transpose(1, 2).contiguous().view(nbatches, -1, out.size(1) * out.size(-1))
    return out @ w_o.t(), (key, value)
