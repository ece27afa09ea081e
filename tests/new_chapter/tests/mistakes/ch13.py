"""Mistakes of chapter 13 that no known bug is (tests/mistakes/__init__.py)."""

from mistakes import Mistake

MISTAKES = (
    Mistake("sliding_window_mask", "window-one-too-narrow",
            "(offset < window)", "(offset < window - 1)",
            None, "takes window - 1 as the width, as if the query were not counted"),
    Mistake("sliding_window_mask", "indices-for-positions",
            "offset = positions[:, None] - positions[None, :]",
            "offset = torch.arange(len(positions))[:, None] - torch.arange(len(positions))[None, :]",
            None, "counts index distances, not positions: the gaps are lost"),
    Mistake("sliding_window_mask", "or-for-and",
            "return (offset >= 0) & (offset < window)", "return (offset >= 0) | (offset < window)",
            None, "| where & belongs: every key is kept"),
    Mistake("sliding_window_mask", "mask-as-integers",
            "return (offset >= 0) & (offset < window)", "return ((offset >= 0) & (offset < window)).long()",
            "dtype", "returns 0 and 1 as integers, not a bool mask"),
    Mistake("sliding_window_mask", "window-ignored",
            "return (offset >= 0) & (offset < window)", "return offset >= 0",
            None, "only the causal half: the window is never applied"),
)
