"""Chapter 6 the way a config-driven Hugging Face model is written.

The module builds a small config and keeps it as ``self.config``; as in
transformers, which attention function runs is the config's private
``_attn_implementation`` ("eager" here, "sdpa" through a table of
functions), and a dtype may be given as its name, the way configs store
``torch_dtype="bfloat16"``, turned into the dtype with ``getattr(torch,
name)``. K/V heads are matched to query heads by indexing with
``arange(H_q) // group`` rather than by repeating them.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class AttentionConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    attention_bias: bool = False
    _attn_implementation: str = "eager"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def expand_kv_heads(kv, num_query_heads):
    num_kv_heads = kv.size(1)
    if num_query_heads % num_kv_heads:
        raise ValueError(f"num_attention_heads ({num_query_heads}) must be a multiple of "
                         f"num_key_value_heads ({num_kv_heads})")
    group = num_query_heads // num_kv_heads
    return kv[:, torch.arange(num_query_heads, device=kv.device) // group]  # (B, H_q, S, d)


def eager_attention_forward(query, key, value, attention_mask=None):
    key = expand_kv_heads(key, query.size(1))
    value = expand_kv_heads(value, query.size(1))
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * query.size(-1) ** -0.5
    if attention_mask is not None:
        attn_weights = attn_weights.masked_fill(~attention_mask, float("-inf"))
    no_key = torch.isneginf(attn_weights).all(dim=-1, keepdim=True)
    attn_weights = F.softmax(attn_weights.masked_fill(no_key, 0.0), dim=-1).masked_fill(no_key, 0.0)
    return torch.matmul(attn_weights, value), attn_weights


def sdpa_attention_forward(query, key, value, attention_mask=None):
    key = expand_kv_heads(key, query.size(1))
    value = expand_kv_heads(value, query.size(1))
    attn_output = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask)
    if attention_mask is not None:  # a query with no key: zeros, as the eager path gives
        attn_output = attn_output.masked_fill(~attention_mask.any(dim=-1, keepdim=True), 0.0)
    return attn_output, None


ALL_ATTENTION_FUNCTIONS = {"sdpa": sdpa_attention_forward}


def grouped_query_attention(q, k, v, mask=None):
    return eager_attention_forward(q, k, v, mask)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, num_heads, num_kv_heads, bias=False):
        super().__init__()
        self.config = AttentionConfig(d_model, num_heads, num_kv_heads, attention_bias=bias)
        if d_model % num_heads:
            raise ValueError(f"hidden_size ({d_model}) must be a multiple of num_attention_heads ({num_heads})")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of "
                             f"num_key_value_heads ({num_kv_heads})")
        config = self.config
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * config.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=bias)
        self.out_proj = nn.Linear(config.num_attention_heads * config.head_dim, config.hidden_size, bias=bias)

    def forward(self, hidden_states, mask=None):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.config.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        attention_interface = eager_attention_forward
        if self.config._attn_implementation != "eager":
            attention_interface = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        attn_output, _ = attention_interface(query_states, key_states, value_states, mask)
        attn_output = attn_output.transpose(1, 2).reshape(*input_shape, -1).contiguous()
        return self.out_proj(attn_output)


def kv_cache_bytes(batch, seq_len, num_layers, num_kv_heads, head_dim, dtype):
    if isinstance(dtype, str):  # "bfloat16", as a config stores it
        dtype = getattr(torch, dtype)
    return 2 * batch * seq_len * num_layers * num_kv_heads * head_dim * dtype.itemsize
