"""Chapter 13: sliding-window attention.

A token sees itself and the ``window - 1`` tokens before it, as in
Longformer's and Mistral's local attention. The lesson is
chapters/13_sliding_window/README.md.
"""

import torch


def sliding_window_mask(positions: torch.Tensor, window: int) -> torch.Tensor:
    """The mask of sliding-window attention: True where query i may attend key j.

    Args:
        positions: ``(T,)``, int64, each token's position, increasing (gaps allowed).
        window: how many positions a token sees, itself included; at least 1.

    Returns:
        ``(T, T)``, bool, on the device of ``positions``: True where
        ``0 <= positions[i] - positions[j] < window``.
    """
    # BEGIN SOLUTION
    offset = positions[:, None] - positions[None, :]  # (T, T): how far key j is behind query i
    return (offset >= 0) & (offset < window)
    # END SOLUTION
