"""Chapter 9's oracles: PyTorch's attention (``F.scaled_dot_product_attention``,
with chapter 4's bottom-right causal mask as its ``attn_mask`` when causal)
with ``torch.logsumexp`` of the masked scaled scores, and its gradients by
autograd through it; none of them tiled, none from the course's solutions.

Shapes: q ``(..., L, d)``, k ``(..., S, d)``, v ``(..., S, d_v)``; an output
``(..., L, d_v)``, its log-sum-exp ``(..., L)``, and ``grad_out`` (the
gradient of the loss with respect to the output) ``(..., L, d_v)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grader.oracles import attention_with_lse, bottom_right_mask

__all__ = ["attention_gradients", "attention_with_lse", "bottom_right_mask"]


def attention_gradients(q, k, v, grad_out, causal=False):
    """``(out, dq, dk, dv)``: the output of ``F.scaled_dot_product_attention``
    and the gradients of ``sum(out * grad_out)`` with respect to q, k and v, by
    autograd through it, computed in float64 whatever the inputs' dtype and
    returned in ``q``'s. A query with no visible key gets a zero output and a
    zero row of dq, and adds nothing to dk and dv."""
    leaves = [tensor.detach().to(torch.float64).clone().requires_grad_(True) for tensor in (q, k, v)]
    mask = bottom_right_mask(q.shape[-2], k.shape[-2]) if causal else None
    out = F.scaled_dot_product_attention(*leaves, attn_mask=mask)  # (..., L, d_v)
    grads = torch.autograd.grad((out * grad_out.to(torch.float64)).sum(), leaves)
    return tuple(tensor.detach().to(q.dtype) for tensor in (out, *grads))
