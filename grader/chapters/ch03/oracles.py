"""Chapter 3's oracles: heads as slices and concatenations, a loop over
heads with ``F.scaled_dot_product_attention``, and PyTorch's own
``nn.MultiheadAttention`` loaded with the same weights.

Shapes: x ``(..., T, D)`` split into ``(..., H, T, d)`` with ``D = H * d``;
query ``(..., L, E_q)``, key ``(..., S, E_k)``, value ``(..., S, E_v)``;
weights ``(d_out, d_in)`` as ``F.linear`` takes them; a mask broadcastable
to ``(..., H, L, S)``, True = may attend. A module's state is given in the
course's names: ``qkv.weight (3D, D)``, ``qkv.bias (3D,)``, ``out.weight
(D, D)``, ``out.bias (D,)``, or ``q.weight``, ``k.weight``, ``v.weight`` for
inputs of other widths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from grader.oracles import gradients, multihead_attention

__all__ = ["head_loop", "head_loop_gradients", "merge_heads", "module_attention", "module_gradient",
           "one_head_attention", "parameter_count", "pytorch_multi_head_attention", "split_heads",
           "torch_module", "torch_multihead_forward", "values_through_output"]


def split_heads(x, num_heads):
    """``(..., T, D) -> (..., H, T, d)`` as a stack of feature slices, one per head."""
    width = x.shape[-1] // num_heads
    return torch.stack([x[..., h * width:(h + 1) * width] for h in range(num_heads)], dim=-3)


def merge_heads(x):
    """``(..., H, T, d) -> (..., T, H * d)``: the heads' features side by side."""
    return torch.cat(x.unbind(dim=-3), dim=-1)


def head_loop(query, key, value, num_heads, w_q, w_k, w_v, w_o, mask=None):
    """Multi-head attention one head at a time with ``F.scaled_dot_product_attention``:
    ``(..., L, d_out)``."""
    d, d_v = w_q.shape[0] // num_heads, w_v.shape[0] // num_heads
    batch = torch.broadcast_tensors(query[..., :1, :1], key[..., :1, :1])[0].shape[:-2]
    length, keys = query.shape[-2], key.shape[-2]
    outputs = []
    for h in range(num_heads):
        q = F.linear(query, w_q[h * d:(h + 1) * d])  # (..., L, d)
        k = F.linear(key, w_k[h * d:(h + 1) * d])  # (..., S, d)
        v = F.linear(value, w_v[h * d_v:(h + 1) * d_v])  # (..., S, d_v)
        head_mask = None
        if mask is not None:
            head_mask = torch.broadcast_to(mask, (*batch, num_heads, length, keys))[..., h, :, :]
        outputs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=head_mask))
    return F.linear(torch.cat(outputs, dim=-1), w_o)  # (..., L, d_out)


def head_loop_gradients(query, key, value, num_heads, w_q, w_k, w_v, w_o, mask, upstream):
    """Gradients of ``<head_loop(...), upstream>`` with respect to query, key,
    value and the four weights."""
    return gradients(lambda q, k, v, *w: head_loop(q, k, v, num_heads, *w, mask=mask),
                     [query, key, value, w_q, w_k, w_v, w_o], list(range(7)), upstream)


def one_head_attention(query, key, value, w_q, w_k, w_v, w_o):
    """``F.scaled_dot_product_attention`` over the full-width projections,
    then ``w_o``: ``(..., L, d_out)``."""
    single = F.scaled_dot_product_attention(F.linear(query, w_q), F.linear(key, w_k), F.linear(value, w_v))
    return F.linear(single, w_o)


def torch_module(state, d_model, num_heads, batch_first=True, kdim=None, vdim=None):
    """An ``nn.MultiheadAttention`` in eval mode holding the parameters of
    ``state`` (course names, see above)."""
    bias = "out.bias" in state
    module = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=batch_first,
                                   kdim=kdim, vdim=vdim)
    theirs = {"out_proj.weight": state["out.weight"]}
    if "qkv.weight" in state:
        theirs["in_proj_weight"] = state["qkv.weight"]
    elif module.in_proj_weight is not None:  # inputs of width d_model: one packed weight
        theirs["in_proj_weight"] = torch.cat([state["q.weight"], state["k.weight"], state["v.weight"]])
    else:
        theirs.update(q_proj_weight=state["q.weight"], k_proj_weight=state["k.weight"],
                      v_proj_weight=state["v.weight"])
    if bias:
        theirs["in_proj_bias"] = state["qkv.bias"]
        theirs["out_proj.bias"] = state["out.bias"]
    module.load_state_dict(theirs)
    return module.eval()


def pytorch_multi_head_attention(state, num_heads, query, key, value, mask=None):
    """``nn.MultiheadAttention`` (batch first) holding ``q.weight``...
    ``out.weight`` of ``state``, given a course mask ``(B, H, L, S)`` or
    None: ``(B, L, E_q)``."""
    module = torch_module(state, query.shape[-1], num_heads, kdim=key.shape[-1], vdim=value.shape[-1])
    attn_mask = None if mask is None else (~mask).flatten(0, 1)  # (N * H, L, S), True = blocked
    return module(query, key, value, attn_mask=attn_mask, need_weights=False)[0].detach()


def module_attention(state, num_heads, x, mask=None, need_weights=False):
    """``(output, weights or None)``: the self-attention over x of an
    ``nn.MultiheadAttention`` holding ``state``, with a course mask (True =
    may attend): its attn_mask is True where attention is blocked, and a
    per-batch, per-head mask is laid out ``(N * H, L, S)``. Weights per head."""
    module = torch_module(state, x.shape[-1], num_heads)
    attn_mask = None
    if mask is not None:
        attn_mask = ~mask if mask.dim() == 2 else (~mask).flatten(0, 1)
    output, weights = module(x, x, x, attn_mask=attn_mask, need_weights=need_weights,
                             average_attn_weights=False)
    return output.detach(), None if weights is None else weights.detach()


def module_gradient(state, num_heads, x, upstream):
    """The gradient of ``<module_attention(state, ...) output, upstream>`` with respect to x."""
    module = torch_module(state, x.shape[-1], num_heads)
    (gradient,) = gradients(lambda t: module(t, t, t, need_weights=False)[0], [x], [0], upstream)
    return gradient


def values_through_output(state, num_heads, x):
    """Each head's values carried through its columns of the output
    projection: ``v_h @ out.weight[:, h*d:(h+1)*d].T``, ``(B, H, T, D)``, so
    that for any weights ``(B, H, T, T)`` the module's output is
    ``(weights @ this).sum(-3) + out.bias``."""
    width = x.shape[-1]
    value = F.linear(x, state["qkv.weight"][2 * width:], state["qkv.bias"][2 * width:])  # (B, T, D)
    heads = split_heads(value, num_heads)  # (B, H, T, d)
    columns = split_heads(state["out.weight"], num_heads)  # (H, D, d): head h's columns of out
    return heads @ columns.transpose(-2, -1)  # (B, H, T, D)


def torch_multihead_forward(state, query, key, value, num_heads, batch_first, key_padding_mask=None):
    """The output of an ``nn.MultiheadAttention`` holding ``state``;
    key_padding_mask ``(N, S)``, True = ignore."""
    module = torch_module(state, query.shape[-1], num_heads, batch_first=batch_first)
    output, _ = multihead_attention(module, query, key, value, key_padding_mask, need_weights=False)
    return output.detach()


def parameter_count(d_model, num_heads, bias=True):
    """The number of parameters of ``nn.MultiheadAttention(d_model, num_heads,
    bias=bias)``, built on the meta device: shapes without memory, for a
    model too wide to build too (on torch 2.5 that imports sympy, a costly import)."""
    module = nn.MultiheadAttention(d_model, num_heads, bias=bias, device="meta")
    return sum(parameter.numel() for parameter in module.parameters())
