"""Chapter 1 as a student's notebook exports it (File > Save and Export as .py).

The first cell is the usual macOS fix for two OpenMP runtimes in one
process, ``os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "TRUE")``. The
notebook keeps its data folder in a ``pathlib.Path``, the NumPy array type
of its hints under ``if TYPE_CHECKING:``, and its experiment (a batch saved
with ``torch.save`` and read back with ``torch.load``) under ``if __name__ ==
"__main__":``. The softmax is a small class whose method is called
``softmax`` (``stats.softmax(x)``, a method of the student's own object, not
of a tensor); the NumPy exercises take their settings from a dataclass that
also records the torch dtype of the experiment, ``torch.float32``, which
they never use.
"""

# In[1]:


import os

os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "TRUE")  # macOS: torch and NumPy each bring an OpenMP


# In[2]:


import math
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from numpy.typing import NDArray

DATA = pathlib.Path("data")


@dataclass(frozen=True)
class Settings:
    """What every cell of the notebook runs with."""

    torch_dtype: torch.dtype = torch.float32  # the experiment's tensors
    masked: float = -math.inf  # the score of a key a query may not see


# In[3]:


class StableSoftmax:
    """Softmax along one dimension, shifted by the largest entry first."""

    def __init__(self, dim: int = -1):
        self.dim = dim

    def shift(self, x: torch.Tensor) -> torch.Tensor:
        """The largest entry of each slice, 0 for a slice that is all -inf."""
        largest = x.amax(dim=self.dim, keepdim=True).detach()
        return torch.where(torch.isfinite(largest), largest, torch.zeros_like(largest))

    def softmax(self, x: torch.Tensor) -> torch.Tensor:
        exps = torch.exp(x - self.shift(x))
        return exps / exps.sum(dim=self.dim, keepdim=True)


def softmax(x, dim=-1):
    stats = StableSoftmax(dim)
    return stats.softmax(x)


# In[4]:


def scaled_dot_product_attention(q, k, v, mask=None, scale=None):
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = torch.einsum("...ld,...sd->...ls", q, k) * scale
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    elif mask is not None:
        scores = scores + mask
    nobody = scores.isneginf().all(-1, keepdim=True)
    weights = softmax(scores.masked_fill(nobody, 0), dim=-1).masked_fill(nobody, 0)
    return torch.einsum("...ls,...sd->...ld", weights, v), weights


def self_attention(x, w_q, w_k, w_v, mask=None):
    return scaled_dot_product_attention(x @ w_q.mT, x @ w_k.mT, x @ w_v.mT, mask)


# In[5]:


def softmax_numpy(x: "NDArray[np.floating]", axis: int = -1) -> "NDArray[np.floating]":
    largest = x.max(axis=axis, keepdims=True)
    largest[~np.isfinite(largest)] = 0
    exps = np.exp(x - largest)
    return exps / exps.sum(axis=axis, keepdims=True)


def scaled_dot_product_attention_numpy(q, k, v, mask=None):
    settings = Settings()
    scores = np.einsum("...ld,...sd->...ls", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, settings.masked)
    nobody = np.isneginf(scores).all(axis=-1, keepdims=True)
    weights = np.where(nobody, 0, softmax_numpy(np.where(nobody, 0, scores)))
    return np.einsum("...ls,...sd->...ld", weights, v), weights


# In[6]:


if __name__ == "__main__":
    batch_file = DATA / "batch.pt"
    if not batch_file.exists():
        DATA.mkdir(exist_ok=True)
        torch.save({"x": torch.randn(2, 5, 8, dtype=Settings().torch_dtype)}, batch_file)
    x = torch.load(batch_file)["x"]
    out, weights = self_attention(x, *torch.randn(3, 8, 8))
    print(out.shape, weights.sum(-1))
