"""Chapter 6's oracles: a loop over query heads with
``F.scaled_dot_product_attention`` (no repeat of any kind), the same function
with ``enable_gqa=True``, ``nn.MultiheadAttention`` when every query head has
its own K/V head, the module from ``F.linear`` and the loop, gradients by
autograd, and the KV-cache size written out.

Shapes: q ``(B, H_q, L, d)``, k ``(B, H_kv, S, d)``, v ``(B, H_kv, S, d_v)``
with groups of ``H_q / H_kv`` query heads; a mask broadcastable to
``(B, H_q, L, S)``, True = may attend. x ``(B, T, D)``; a module's state in
the course's names: ``q_proj.weight (H_q * d, D)``, ``k_proj.weight`` and
``v_proj.weight (H_kv * d, D)``, ``out_proj.weight (D, H_q * d)``, and the
biases of the same names when it has them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from grader.oracles import attention, gradients

__all__ = ["attention", "cache_bytes", "enable_gqa_attention", "expand_by_index", "gqa_module",
           "gqa_module_gradient", "head_loop", "head_loop_gradients",
           "head_with_each_kv_head", "multihead_attention_module", "split_heads"]


# -- attention, one query head at a time ----------------------------------------------------


def _per_query_head(mask, q, k, head):
    """The ``(B, L, S)`` slice of a mask broadcast to the scores ``(B, H_q, L, S)``."""
    if mask is None:
        return None
    batch, num_query_heads, length, _ = q.shape
    return torch.broadcast_to(mask, (batch, num_query_heads, length, k.shape[-2]))[:, head]


def _head_with(q, k, v, head, kv_head, mask=None):
    """``(output, weights)`` of query head ``head`` attending with K/V head ``kv_head``."""
    return attention(q[:, head], k[:, kv_head], v[:, kv_head], _per_query_head(mask, q, k, head))


def head_loop(q, k, v, mask=None):
    """``(output, weights)``, ``(B, H_q, L, d_v)`` and ``(B, H_q, L, S)``:
    query head h with K/V head h // group, one head at a time with
    ``F.scaled_dot_product_attention``."""
    group = q.shape[1] // k.shape[1]
    heads = [_head_with(q, k, v, h, h // group, mask) for h in range(q.shape[1])]
    return torch.stack([o for o, _ in heads], dim=1), torch.stack([w for _, w in heads], dim=1)


def head_loop_gradients(q, k, v, mask, upstream):
    """Gradients of ``<head_loop(q, k, v, mask) output, upstream>`` with respect to q, k and v."""
    return gradients(lambda *t: head_loop(*t, mask)[0], [q, k, v], [0, 1, 2], upstream)


def head_with_each_kv_head(q, k, v):
    """``(outputs, weights)``: query head h attending with K/V head j, for
    every h and every j, ``(B, H_q, H_kv, L, d_v)`` and ``(B, H_q, H_kv, L, S)``."""
    pairs = [[_head_with(q, k, v, h, j) for j in range(k.shape[1])] for h in range(q.shape[1])]
    outputs = torch.stack([torch.stack([o for o, _ in row], dim=1) for row in pairs], dim=1)
    weights = torch.stack([torch.stack([w for _, w in row], dim=1) for row in pairs], dim=1)
    return outputs, weights


def expand_by_index(kv, num_query_heads):
    """``kv[:, h // group]`` for every query head h: ``(B, H_q, S, d)``."""
    group = num_query_heads // kv.shape[1]
    return torch.stack([kv[:, h // group] for h in range(num_query_heads)], dim=1)


def enable_gqa_attention(q, k, v):
    """``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)``: ``(B, H_q, L, d_v)``."""
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


# -- the module -------------------------------------------------------------------------------


def split_heads(t, num_heads):
    """``(B, T, H * d) -> (B, H, T, d)``."""
    batch, length, _ = t.shape
    return t.view(batch, length, num_heads, -1).transpose(1, 2)  # (B, H, T, d)


def gqa_module(state, num_heads, num_kv_heads, x, mask=None):
    """GroupedQueryAttention holding ``state``, from ``F.linear`` and the loop
    over query heads: ``(B, T, D)``."""
    def project(name, heads):  # (B, heads, T, d)
        return split_heads(F.linear(x, state[f"{name}.weight"], state.get(f"{name}.bias")), heads)

    q, k, v = project("q_proj", num_heads), project("k_proj", num_kv_heads), project("v_proj", num_kv_heads)
    output, _ = head_loop(q, k, v, mask)  # (B, H_q, T, d)
    merged = output.transpose(1, 2).reshape(*x.shape[:-1], -1)  # (B, T, H_q * d)
    return F.linear(merged, state["out_proj.weight"], state.get("out_proj.bias"))


def gqa_module_gradient(state, num_heads, num_kv_heads, x, upstream):
    """The gradient of ``<gqa_module(state, ..., x), upstream>`` with respect to x."""
    (gradient,) = gradients(lambda t: gqa_module(state, num_heads, num_kv_heads, t), [x], [0], upstream)
    return gradient


def multihead_attention_module(state, num_heads, x):
    """The self-attention over x of an ``nn.MultiheadAttention`` (batch first,
    eval mode) holding ``state``, whose K/V heads are as many as its query
    heads: ``(B, T, D)``."""
    bias = "out_proj.bias" in state
    module = nn.MultiheadAttention(x.shape[-1], num_heads, bias=bias, batch_first=True)
    names = ("q_proj", "k_proj", "v_proj")
    theirs = {"in_proj_weight": torch.cat([state[f"{n}.weight"] for n in names]),
              "out_proj.weight": state["out_proj.weight"]}
    if bias:
        theirs["in_proj_bias"] = torch.cat([state[f"{n}.bias"] for n in names])
        theirs["out_proj.bias"] = state["out_proj.bias"]
    module.load_state_dict(theirs)
    return module.eval()(x, x, x, need_weights=False)[0].detach()


# -- the KV cache -------------------------------------------------------------------------------

# Bytes of one number, written out here rather than read from torch.
BYTES_PER_NUMBER = {torch.float64: 8, torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.int8: 1}


def cache_bytes(batch, seq_len, num_layers, num_kv_heads, head_dim, dtype):
    """2 (a key and a value) x B x T x layers x H_kv x d x bytes per number."""
    return 2 * batch * seq_len * num_layers * num_kv_heads * head_dim * BYTES_PER_NUMBER[dtype]
