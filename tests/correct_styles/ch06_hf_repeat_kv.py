"""Chapter 6 in the style of Hugging Face's LLaMA (modeling_llama.py).

``repeat_kv`` as ``expand`` of a new group axis then ``reshape`` (no copy
until the reshape), ``eager_attention_forward`` with ``scaling =
head_dim ** -0.5``, masked scores set to ``torch.finfo(dtype).min`` and
``softmax(..., dtype=torch.float32).to(query.dtype)``; since ``finfo.min`` is
not ``-inf``, the masked weights are zeroed after the softmax so that a query
with no key gets nothing. The module keeps LlamaAttention's attribute names
(``num_key_value_groups``, ``scaling``, ``hidden_shape``).
"""

import torch
from torch import nn


def expand_kv_heads(kv: torch.Tensor, num_query_heads: int) -> torch.Tensor:
    batch, num_key_value_heads, slen, head_dim = kv.shape
    if num_query_heads % num_key_value_heads != 0:
        raise ValueError(f"num_query_heads ({num_query_heads}) must be a multiple of "
                         f"num_key_value_heads ({num_key_value_heads})")
    n_rep = num_query_heads // num_key_value_heads
    if n_rep == 1:
        return kv
    hidden_states = kv[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def grouped_query_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    key_states = expand_kv_heads(k, q.shape[1])
    value_states = expand_kv_heads(v, q.shape[1])
    scaling = q.shape[-1] ** -0.5

    attn_weights = torch.matmul(q, key_states.transpose(2, 3)) * scaling  # (B, H_q, L, S)
    if mask is not None:
        attn_weights = attn_weights.masked_fill(~mask, torch.finfo(attn_weights.dtype).min)

    # upcast attention to fp32
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
    if mask is not None:
        # finfo.min is finite: a row with every key masked would come out uniform.
        attn_weights = attn_weights.masked_fill(~mask, 0.0)
    attn_output = torch.matmul(attn_weights, value_states)  # (B, H_q, L, d_v)
    return attn_output, attn_weights


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"hidden size {d_model} is not divisible by num_heads {num_heads}")
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads {num_heads} is not divisible by num_key_value_heads {num_kv_heads}")
        self.head_dim = d_model // num_heads
        self.num_heads = num_heads
        self.num_key_value_heads = num_kv_heads
        self.num_key_value_groups = num_heads // num_kv_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        input_shape = x.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_proj(x).view(hidden_shape).transpose(1, 2)  # (B, H_q, T, d)
        key_states = self.k_proj(x).view(hidden_shape).transpose(1, 2)  # (B, H_kv, T, d)
        value_states = self.v_proj(x).view(hidden_shape).transpose(1, 2)

        attn_output, attn_weights = grouped_query_attention(query_states, key_states, value_states, mask)

        attn_output = attn_output.transpose(1, 2).contiguous()  # (B, T, H_q, d)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()  # (B, T, H_q * d)
        return self.out_proj(attn_output)


def kv_cache_bytes(
    batch: int,
    seq_len: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> int:
    # bytes of one element of this dtype, asked of an empty tensor
    bytes_per_element = torch.empty(0, dtype=dtype).element_size()
    # 2: one tensor for the keys and one for the values, (B, H_kv, T, d) per layer
    return 2 * num_layers * batch * num_kv_heads * seq_len * head_dim * bytes_per_element
