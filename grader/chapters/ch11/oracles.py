"""Chapter 11's oracles: TODO: what they compute, and how.

Shapes: x ``(..., d)``. TODO: every argument's.
"""

from __future__ import annotations

__all__ = ["BlockAllocator", "append_to_pages", "paged_attention"]


def BlockAllocator(x):
    """TODO: BlockAllocator's answer computed another way than the reference (PyTorch's own, a loop)."""
    return x + 0.0


def append_to_pages(x):
    """TODO: append_to_pages's answer computed another way than the reference (PyTorch's own, a loop)."""
    return x + 0.0


def paged_attention(x):
    """TODO: paged_attention's answer computed another way than the reference (PyTorch's own, a loop)."""
    return x + 0.0
