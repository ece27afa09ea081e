"""Chapter 1's oracles: PyTorch's attention, and its gradients by autograd.

Shapes: q ``(..., L, d_k)``, k ``(..., S, d_k)``, v ``(..., S, d_v)``,
x ``(..., T, d_model)``, projection weights ``(d_out, d_model)`` as
``F.linear`` takes them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grader.oracles import attention, gradients

__all__ = ["attention", "attention_gradients", "self_attention", "self_attention_gradients",
           "softmax_gradient"]


def softmax_gradient(x, upstream, dim=-1):
    """The gradient of ``<torch.softmax(x, dim), upstream>`` with respect to x."""
    (gradient,) = gradients(lambda t: torch.softmax(t, dim=dim), [x], [0], upstream)
    return gradient


def attention_gradients(q, k, v, mask, upstream):
    """Gradients of ``<F.scaled_dot_product_attention(q, k, v, mask), upstream>``
    with respect to q, k and v."""
    return gradients(lambda *t: F.scaled_dot_product_attention(*t, attn_mask=mask), [q, k, v],
                     [0, 1, 2], upstream)


def self_attention(x, w_q, w_k, w_v, mask=None):
    """``(output, weights)`` of attention over ``F.linear`` projections of x."""
    return attention(F.linear(x, w_q), F.linear(x, w_k), F.linear(x, w_v), mask)


def self_attention_gradients(x, w_q, w_k, w_v, upstream):
    """Gradients of ``<self_attention(x, ...) output, upstream>`` with respect
    to x and the three weights."""
    return gradients(lambda *t: self_attention(*t)[0], [x, w_q, w_k, w_v], [0, 1, 2, 3], upstream)
