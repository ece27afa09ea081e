"""Chapter 13 in broadcast comparisons: a key is in the window when it is not
later than the query and not too far behind it."""

import torch


def sliding_window_mask(positions: torch.Tensor, window: int) -> torch.Tensor:
    query, key = positions.unsqueeze(-1), positions.unsqueeze(-2)  # (T, 1), (1, T)
    not_later = key <= query
    close_enough = key > query - window
    return not_later & close_enough  # (T, T)
