"""Chapter 9's oracles: TODO: what they compute, and how.

Shapes: x ``(..., d)``. TODO: every argument's.
"""

from __future__ import annotations

__all__ = ["flash_attention_forward", "flash_attention_backward", "FlashAttentionFunction"]


def flash_attention_forward(x):
    """TODO: flash_attention_forward's answer computed another way than the reference (PyTorch's own, a loop)."""
    return x + 0.0


def flash_attention_backward(x):
    """TODO: flash_attention_backward's answer computed another way than the reference (PyTorch's own, a loop)."""
    return x + 0.0


def FlashAttentionFunction(x):
    """TODO: FlashAttentionFunction's answer computed another way than the reference (PyTorch's own, a loop)."""
    return x + 0.0
