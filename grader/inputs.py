"""Random inputs for the checks, seeded per check so a run can be replayed.

Inputs are made on the CPU, where the grader computes every expected value;
the worker moves them to the device being graded.

Each check gets its own generator, seeded from the run's seed and the
check's id: adding a check does not change the inputs of the others, and
``mha-course grade --seed N`` reproduces a run exactly.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch


class Inputs:
    """Makes the tensors one check feeds to the submission and the reference."""

    def __init__(self, seed: int, check_id: str):
        self.generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{check_id}".encode()))

    def randn(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Standard normal entries (drawn in float64, then cast, so every
        dtype sees the same numbers)."""
        return torch.randn(*shape, generator=self.generator, dtype=torch.float64).to(dtype)

    def mask(self, *shape: int, keep: float = 0.6, empty_rows: bool = False) -> torch.Tensor:
        """A boolean mask, True = may attend, with about ``keep`` of it True.

        Unless ``empty_rows``, every row (last dimension) keeps at least one
        key, so no query is left with nothing to attend to.
        """
        allowed = torch.rand(*shape, generator=self.generator) < keep
        if not empty_rows:
            first = torch.zeros(shape, dtype=torch.bool)
            first[..., torch.randint(shape[-1], (), generator=self.generator)] = True
            allowed |= first
        return allowed

    def permutation(self, size: int) -> torch.Tensor:
        return torch.randperm(size, generator=self.generator)

    def numpy(self, *shape: int, dtype: type = np.float64) -> np.ndarray:
        """Standard normal entries as a NumPy array."""
        return self.randn(*shape, dtype=torch.float64).cpu().numpy().astype(dtype)
