"""Chapter 4 in the style of Meta's llama reference code.

The style of a student who read facebookresearch/llama's ``model.py``:
masks are additive floats, ``torch.full((seqlen, seqlen), float("-inf"))``
then ``torch.triu(mask, diagonal=1)``, with ``torch.hstack`` of zeros in
front for the ``start_pos`` cached tokens, then ``.type_as(h)``; no mask at
all for a single new token; scores are added to the mask and the softmax
runs in float32, ``F.softmax(scores.float(), dim=-1).type_as(xq)``, whatever
the inputs' dtype (so float16 and bfloat16 gain precision, and float64 is
computed in float32). Heads are split as llama does, ``view(bsz, seqlen,
n_heads, head_dim)`` then ``transpose(1, 2)``. Padding is an additive mask
too; a sequence with no real token gets zero weights.
"""

import math

import torch
import torch.nn.functional as F


def causal_mask(num_queries, num_keys=None, device=None):
    num_keys = num_queries if num_keys is None else num_keys
    start_pos = num_keys - num_queries  # how many tokens come before the queries
    mask = torch.full((num_queries, num_keys), float("-inf"), device=device)
    mask = torch.triu(mask, diagonal=start_pos + 1)
    return mask == 0  # True where nothing is added: the keys a query may see


def _project(x, wq, wk, wv, n_heads):
    bsz, seqlen, _ = x.shape
    xq, xk, xv = F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)
    xq = xq.view(bsz, seqlen, n_heads, -1).transpose(1, 2)  # (bs, n_heads, seqlen, head_dim)
    xk = xk.view(bsz, seqlen, n_heads, -1).transpose(1, 2)
    xv = xv.view(bsz, seqlen, n_heads, -1).transpose(1, 2)
    return xq, xk, xv


def causal_self_attention(x, num_heads, w_q, w_k, w_v, w_o, lengths=None):
    bsz, seqlen, _ = x.shape
    xq, keys, values = _project(x, w_q, w_k, w_v, num_heads)
    head_dim = xq.shape[-1]

    mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device)
    mask = torch.triu(mask, diagonal=1)  # (seqlen, seqlen)
    if lengths is not None:
        pad = torch.zeros((bsz, seqlen), device=x.device)
        pad = pad.masked_fill(torch.arange(seqlen, device=x.device) >= lengths[:, None], float("-inf"))
        mask = mask + pad[:, None, None, :]  # (bs, 1, seqlen, seqlen)
    mask = mask.type_as(x)

    scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(head_dim)
    scores = scores + mask  # (bs, n_heads, seqlen, seqlen)
    no_key = torch.isneginf(scores).all(dim=-1, keepdim=True)  # all padding
    scores = scores.masked_fill(no_key, 0.0)
    scores = F.softmax(scores.float(), dim=-1).type_as(xq).masked_fill(no_key, 0.0)
    output = torch.matmul(scores, values)  # (bs, n_heads, seqlen, head_dim)
    output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
    return F.linear(output, w_o)


def attend_with_cache(x_new, num_heads, w_q, w_k, w_v, w_o, cache=None):
    bsz, seqlen, _ = x_new.shape
    xq, xk, xv = _project(x_new, w_q, w_k, w_v, num_heads)
    head_dim = xq.shape[-1]
    if cache is None:
        start_pos = 0
        keys, values = xk, xv
    else:
        start_pos = cache[0].shape[2]
        keys = torch.cat([cache[0], xk], dim=2)  # (bs, n_heads, start_pos + seqlen, head_dim)
        values = torch.cat([cache[1], xv], dim=2)

    mask = None
    if seqlen > 1:
        mask = torch.full((seqlen, seqlen), float("-inf"), device=x_new.device)
        mask = torch.triu(mask, diagonal=1)
        # When performing key-value caching, we compute the attention scores
        # only for the new sequence. Thus, the matrix of scores is of size
        # (seqlen, cache_len + seqlen), and the only masked entries are (i, j) for
        # j > cache_len + i, since row i corresponds to token cache_len + i.
        mask = torch.hstack([torch.zeros((seqlen, start_pos), device=x_new.device), mask]).type_as(x_new)

    scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(head_dim)
    if mask is not None:
        scores = scores + mask  # (bs, n_heads, seqlen, cache_len + seqlen)
    scores = F.softmax(scores.float(), dim=-1).type_as(xq)
    output = torch.matmul(scores, values)  # (bs, n_heads, seqlen, head_dim)
    output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
    return F.linear(output, w_o), (keys, values)
