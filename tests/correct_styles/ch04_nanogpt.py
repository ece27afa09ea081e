"""Chapter 4 the nanoGPT way.

The style of a student who starts from karpathy/nanoGPT's
``CausalSelfAttention``: the causal mask is a lower-triangular ``bias``
buffer registered on a module (``register_buffer``), which moves with the
module's ``.to(device)``, and scores are masked with
``att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))``; shapes go
``view(B, T, n_head, hs).transpose(1, 2)`` and back with
``transpose(1, 2).contiguous().view(B, T, C)``. The weights come in as
arguments, so the module keeps only the mask (block_size = all the tokens
seen) and the exercises build one per call. With a cache, the new tokens are
the last T rows of the bias: ``self.bias[:, :, S - T:S, :S]``. Padding and
empty rows are the course's additions.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):

    def __init__(self, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        # causal mask to ensure that attention is only applied to the left in the input sequence
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))

    def forward(self, x, w_q, w_k, w_v, w_o, lengths=None, past=None):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)

        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        q = (x @ w_q.t()).view(B, T, self.n_head, -1).transpose(1, 2)  # (B, nh, T, hs)
        k = (x @ w_k.t()).view(B, T, self.n_head, -1).transpose(1, 2)  # (B, nh, T, hs)
        v = (x @ w_v.t()).view(B, T, self.n_head, -1).transpose(1, 2)  # (B, nh, T, hs_v)
        if past is not None:
            k = torch.cat((past[0], k), dim=-2)  # (B, nh, S, hs)
            v = torch.cat((past[1], v), dim=-2)  # (B, nh, S, hs_v)
        S = k.size(-2)

        # causal self-attention; Self-attend: (B, nh, T, hs) x (B, nh, hs, S) -> (B, nh, T, S)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, S - T:S, :S] == 0, float('-inf'))
        if lengths is not None:
            padding = torch.arange(S, device=x.device)[None, :] >= lengths[:, None]  # (B, S)
            att = att.masked_fill(padding[:, None, None, :], float('-inf'))
        empty = torch.isneginf(att).all(dim=-1, keepdim=True)  # a sequence of length 0
        att = F.softmax(att.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
        y = att @ v  # (B, nh, T, S) x (B, nh, S, hs_v) -> (B, nh, T, hs_v)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)  # re-assemble all head outputs side by side

        # output projection
        return y @ w_o.t(), (k, v)


def causal_mask(num_queries, num_keys=None, device=None):
    if num_keys is None:
        num_keys = num_queries
    ones = torch.ones(num_queries, num_keys, device=device)
    return torch.tril(ones, diagonal=num_keys - num_queries) == 1


def causal_self_attention(x, num_heads, w_q, w_k, w_v, w_o, lengths=None):
    attn = CausalSelfAttention(num_heads, block_size=x.size(1)).to(x.device)
    y, _ = attn(x, w_q, w_k, w_v, w_o, lengths=lengths)
    return y


def attend_with_cache(x_new, num_heads, w_q, w_k, w_v, w_o, cache=None):
    past_length = 0 if cache is None else cache[0].size(-2)
    attn = CausalSelfAttention(num_heads, block_size=past_length + x_new.size(1)).to(x_new.device)
    return attn(x_new, w_q, w_k, w_v, w_o, past=cache)
