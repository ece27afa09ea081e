"""Chapter 3 the way Hugging Face transformers writes attention.

A student who learnt attention from reading transformers' modeling files:
heads are split with ``view(hidden_shape).transpose`` and put back with
``transpose(...).contiguous()`` then ``reshape``; one ``eager_attention_forward``
helper does the maths for every exercise; boolean masks are turned into an
additive mask holding ``torch.finfo(dtype).min`` (not -inf) where a key is
hidden; the softmax runs in float32 (``softmax(..., dtype=torch.float32)``)
and is cast back to the query's dtype; projections use
``nn.functional.linear``; the module keeps ``num_heads``, ``head_dim`` and
``scaling`` like a config-built module. Because finfo.min is finite, a row
with no key would be a uniform average: such rows are zeroed explicitly, as
the course asks.
"""

import torch
from torch import nn


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    if x.size(-1) % num_heads != 0:
        raise ValueError(
            f"The hidden size ({x.size(-1)}) is not a multiple of the number of attention "
            f"heads ({num_heads})"
        )
    head_dim = x.size(-1) // num_heads
    hidden_shape = (*x.shape[:-1], num_heads, head_dim)
    return x.view(hidden_shape).transpose(-3, -2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    x = x.transpose(-3, -2).contiguous()  # (..., T, H, d)
    return x.reshape(*x.shape[:-2], -1)


def _additive_mask(mask, dtype):
    """A boolean mask (True = may attend) as the number added to the scores."""
    return torch.zeros_like(mask, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


def eager_attention_forward(query, key, value, attention_mask, scaling, dropout=0.0,
                            training=False, no_key=None):
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    if no_key is not None:
        # finfo(float64).min becomes -inf in the float32 softmax: a row with no key
        # would be NaN there, and NaN in the backward pass; give it zeros instead.
        attn_weights = attn_weights.masked_fill(no_key, 0.0)
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    if no_key is not None:
        attn_weights = attn_weights.masked_fill(no_key, 0.0)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=training)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output, attn_weights


def multi_head_attention(query, key, value, num_heads, w_q, w_k, w_v, w_o, mask=None):
    query_states = split_heads(nn.functional.linear(query, w_q), num_heads)
    key_states = split_heads(nn.functional.linear(key, w_k), num_heads)
    value_states = split_heads(nn.functional.linear(value, w_v), num_heads)
    head_dim = query_states.size(-1)
    attention_mask = no_key = None
    if mask is not None:
        attention_mask = _additive_mask(mask, query_states.dtype)
        no_key = ~mask.any(dim=-1, keepdim=True)
    attn_output, _ = eager_attention_forward(
        query_states, key_states, value_states, attention_mask, head_dim**-0.5, no_key=no_key
    )
    return nn.functional.linear(merge_heads(attn_output), w_o)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(
                f"The hidden size ({d_model}) is not a multiple of the number of attention "
                f"heads ({num_heads})"
            )
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.all_head_size = self.num_heads * self.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * self.all_head_size, bias=bias)
        self.out = nn.Linear(self.all_head_size, d_model, bias=bias)

    def forward(self, hidden_states, mask=None, need_weights=False):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states, key_states, value_states = self.qkv(hidden_states).split(self.all_head_size, dim=-1)
        query_states = query_states.view(hidden_shape).transpose(-3, -2)
        key_states = key_states.view(hidden_shape).transpose(-3, -2)
        value_states = value_states.view(hidden_shape).transpose(-3, -2)

        attention_mask = no_key = None
        if mask is not None:
            attention_mask = _additive_mask(mask, query_states.dtype)
            no_key = ~mask.any(dim=-1, keepdim=True)

        attn_output, attn_weights = eager_attention_forward(
            query_states,
            key_states,
            value_states,
            attention_mask,
            self.scaling,
            dropout=self.attention_dropout,
            training=self.training,
            no_key=no_key,
        )
        attn_output = attn_output.transpose(-3, -2).reshape(*input_shape, -1).contiguous()
        attn_output = self.out(attn_output)
        if need_weights:
            return attn_output, attn_weights
        return attn_output


def torch_multihead_forward(query, key, value, num_heads, in_proj_weight, in_proj_bias,
                            out_proj_weight, out_proj_bias, key_padding_mask=None,
                            batch_first=False):
    if not batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))  # (N, ·, E)
    q_weight, k_weight, v_weight = in_proj_weight.chunk(3)
    if in_proj_bias is not None:
        q_bias, k_bias, v_bias = in_proj_bias.chunk(3)
    else:
        q_bias = k_bias = v_bias = None
    query_states = split_heads(nn.functional.linear(query, q_weight, q_bias), num_heads)
    key_states = split_heads(nn.functional.linear(key, k_weight, k_bias), num_heads)
    value_states = split_heads(nn.functional.linear(value, v_weight, v_bias), num_heads)
    attention_mask = None
    if key_padding_mask is not None:  # True = padding: expand to (N, 1, 1, S)
        attention_mask = _additive_mask(~key_padding_mask[:, None, None, :], query_states.dtype)
    attn_output, _ = eager_attention_forward(
        query_states, key_states, value_states, attention_mask, query_states.size(-1) ** -0.5
    )
    output = nn.functional.linear(merge_heads(attn_output), out_proj_weight, out_proj_bias)
    return output if batch_first else output.transpose(0, 1)


def parameter_count(d_model: int, num_heads: int, bias: bool = True) -> int:
    head_dim = d_model // num_heads
    all_head_size = num_heads * head_dim
    qkv = d_model * 3 * all_head_size + (3 * all_head_size if bias else 0)
    out = all_head_size * d_model + (d_model if bias else 0)
    return qkv + out
