"""Independent answers: what PyTorch's own functions say, not the course's code.

Every exercise is checked against one of these as well as against the
reference solution, so that a mistake shared by the reference and a
student cannot hide.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(q, k, v, mask=None, scale=None):
    """``(output, weights)``: output from ``F.scaled_dot_product_attention``,
    weights from ``torch.softmax``; a query with no key gets zeros in both,
    as in ``F.scaled_dot_product_attention``.

    Shapes: q ``(..., L, d_k)``, k ``(..., S, d_k)``, v ``(..., S, d_v)``,
    mask broadcastable to ``(..., L, S)`` (bool True = attend, or additive).
    """
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1)
    return output, torch.nan_to_num(weights, nan=0.0)


def gradients(function, args, wrt, grad_output):
    """Gradients of ``<function(*args), grad_output>`` with respect to the
    arguments at the indices ``wrt``, computed here (use float64 inputs)."""
    leaves = [a.detach().clone().requires_grad_(i in wrt) for i, a in enumerate(args)]
    scalar = (function(*leaves) * grad_output).sum()  # as the worker does it
    return torch.autograd.grad(scalar, [leaves[i] for i in wrt])
