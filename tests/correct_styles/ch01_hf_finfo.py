"""Chapter 1 in the style of Hugging Face's eager attention.

Habits from ``transformers``' ``eager_attention_forward``: a ``scaling``
variable, ``torch.matmul(query, key.transpose(-1, -2))``, a bool mask turned
into "large negative" scores with ``torch.finfo(dtype).min`` rather than
-inf, and new tensors made from the inputs with ``new_zeros`` / ``new_ones`` /
``new_tensor`` so they follow the inputs' device and dtype. Because finfo.min
is finite, a query with every key masked would get uniform weights: those
rows are found from the mask itself and zeroed.
"""

import numpy as np
import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    row_max = torch.amax(x, dim=dim, keepdim=True)
    row_max = torch.where(row_max.isinf(), x.new_zeros(()), row_max)
    numerator = (x - row_max.detach()).exp()
    return numerator / numerator.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    scaling = q.new_tensor(q.size(-1)).rsqrt() if scale is None else scale
    attn_weights = torch.matmul(q, k.transpose(-1, -2)) * scaling
    attend_nothing = None
    if mask is not None:
        if mask.dtype == torch.bool:
            min_value = torch.finfo(attn_weights.dtype).min
            attn_weights = attn_weights.masked_fill(mask.logical_not(), min_value)
            attend_nothing = ~mask.any(dim=-1, keepdim=True)
        else:
            attn_weights = attn_weights + mask
            attend_nothing = torch.isneginf(mask).all(dim=-1, keepdim=True)
            # a row of -inf would give nan: give it something finite, it is zeroed below
            attn_weights = attn_weights.masked_fill(attend_nothing, 0.0)
    attn_weights = softmax(attn_weights, dim=-1)
    if attend_nothing is not None:
        keep = attend_nothing.logical_not().to(attn_weights.dtype)
        attn_weights = attn_weights * keep
    attn_output = torch.matmul(attn_weights, v)
    return attn_output, attn_weights


def self_attention(x, w_q, w_k, w_v, mask=None):
    query_states = torch.nn.functional.linear(x, w_q)
    key_states = torch.nn.functional.linear(x, w_k)
    value_states = torch.nn.functional.linear(x, w_v)
    return scaled_dot_product_attention(query_states, key_states, value_states, mask=mask)


def softmax_numpy(x, axis=-1):
    row_max = np.amax(x, axis=axis, keepdims=True)
    row_max = np.where(np.isinf(row_max), np.zeros_like(row_max), row_max)
    numerator = np.exp(x - row_max)
    return numerator / numerator.sum(axis=axis, keepdims=True)


def scaled_dot_product_attention_numpy(q, k, v, mask=None):
    scaling = q.dtype.type(q.shape[-1]) ** -0.5
    attn_weights = np.matmul(q, np.swapaxes(k, -1, -2)) * scaling
    if mask is not None:
        attn_weights = np.where(mask, attn_weights, np.finfo(attn_weights.dtype).min)
        keep = np.any(mask, axis=-1, keepdims=True)
        attn_weights = softmax_numpy(attn_weights, axis=-1) * keep
    else:
        attn_weights = softmax_numpy(attn_weights, axis=-1)
    return np.matmul(attn_weights, v), attn_weights
