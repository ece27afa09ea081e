"""Chapter 10's oracles: TODO: what they compute, and how.

Shapes: x ``(..., d)``. TODO: every argument's.
"""

from __future__ import annotations

__all__ = ["sliding_window_mask", "rolling_cache_append", "streaming_attention_step"]


def sliding_window_mask(x):
    """TODO: sliding_window_mask's answer computed another way than the reference (PyTorch's own, a loop)."""
    return x + 0.0


def rolling_cache_append(x):
    """TODO: rolling_cache_append's answer computed another way than the reference (PyTorch's own, a loop)."""
    return x + 0.0


def streaming_attention_step(x):
    """TODO: streaming_attention_step's answer computed another way than the reference (PyTorch's own, a loop)."""
    return x + 0.0
