"""Chapter 13 with torch.cdist: the distance between positions, on the causal side."""

import torch


def sliding_window_mask(positions: torch.Tensor, window: int) -> torch.Tensor:
    column = positions.to(torch.float64).unsqueeze(-1)  # (T, 1)
    distance = torch.cdist(column, column, p=1)  # (T, T): |p_i - p_j|
    causal = positions.unsqueeze(-1) >= positions.unsqueeze(-2)  # (T, T)
    return causal & (distance < window)
