"""Chapter 13's oracles: the window's definition, pair by pair.

Shapes: positions ``(T,)``; a mask ``(T, T)``, bool.
"""

from __future__ import annotations

import torch

__all__ = ["sliding_window_mask"]


def sliding_window_mask(positions, window):
    """True where ``0 <= positions[i] - positions[j] < window``, one pair at a time."""
    values = positions.tolist()
    return torch.tensor([[0 <= query - key < window for key in values] for query in values], dtype=torch.bool)
