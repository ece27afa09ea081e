"""Chapter 3 by a student who writes PyTorch Lightning modules.

The module saves its own hyperparameters the way ``save_hyperparameters()``
does, from ``locals()`` in ``__init__``, keeps them in a namespace and shows
them with ``vars()`` in ``extra_repr``; it has Lightning's (and nanoGPT's)
``configure_optimizers``, which asks ``inspect.signature(torch.optim.AdamW)``
whether a fused AdamW exists; and it keeps its head count in a private
attribute, ``self._num_heads``, which ``load_heads_from`` also reads on the
module it copies from (``other._num_heads``). The functions split heads with
``unflatten`` and ``movedim`` and merge them with ``flatten``.
"""

import inspect
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


def split_heads(x, num_heads):
    if x.shape[-1] % num_heads != 0:
        raise ValueError(f"cannot split {x.shape[-1]} features into {num_heads} heads")
    return x.unflatten(-1, (num_heads, -1)).movedim(-2, -3)  # (..., T, D) -> (..., H, T, d)


def merge_heads(x):
    return x.movedim(-3, -2).flatten(-2)  # (..., H, T, d) -> (..., T, H * d)


def _attend(q, k, v, mask=None, dropout=0.0, training=False):
    """Attention of every head at once; a query with no key gets zero weights."""
    scores = q @ k.mT / math.sqrt(q.shape[-1])  # (..., H, L, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    no_key = torch.isneginf(scores).all(dim=-1, keepdim=True)
    weights = scores.masked_fill(no_key, 0.0).softmax(dim=-1).masked_fill(no_key, 0.0)
    weights = F.dropout(weights, p=dropout, training=training)
    return weights @ v, weights


def multi_head_attention(query, key, value, num_heads, w_q, w_k, w_v, w_o, mask=None):
    q, k, v = (split_heads(F.linear(t, w), num_heads) for t, w in ((query, w_q), (key, w_k), (value, w_v)))
    heads, _ = _attend(q, k, v, mask)
    return F.linear(merge_heads(heads), w_o)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.hparams = SimpleNamespace(**{name: value for name, value in locals().items()
                                          if name not in ("self", "__class__")})
        if d_model % num_heads != 0:
            raise ValueError(f"cannot split {d_model} features into {num_heads} heads")
        self._num_heads = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={value}" for name, value in vars(self.hparams).items())

    def load_heads_from(self, other: "MultiHeadAttention") -> None:
        if other._num_heads != self._num_heads:
            raise ValueError(f"{other._num_heads} heads cannot fill {self._num_heads}")
        self.load_state_dict(other.state_dict())

    def configure_optimizers(self, learning_rate: float = 1e-3, weight_decay: float = 0.1):
        fused_available = "fused" in inspect.signature(torch.optim.AdamW).parameters
        use_fused = fused_available and self.qkv.weight.device.type == "cuda"
        extra_args = dict(fused=True) if use_fused else dict()
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, weight_decay=weight_decay, **extra_args)

    def forward(self, x, mask=None, need_weights=False):
        q, k, v = (split_heads(t, self._num_heads) for t in self.qkv(x).chunk(3, dim=-1))
        heads, weights = _attend(q, k, v, mask, self.hparams.dropout, self.training)
        output = self.out(merge_heads(heads))
        return (output, weights) if need_weights else output


def torch_multihead_forward(query, key, value, num_heads, in_proj_weight, in_proj_bias,
                            out_proj_weight, out_proj_bias, key_padding_mask=None, batch_first=False):
    if not batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))  # (N, ·, E)
    biases = in_proj_bias.chunk(3) if in_proj_bias is not None else (None,) * 3
    q, k, v = (split_heads(F.linear(t, w, b), num_heads)
               for t, w, b in zip((query, key, value), in_proj_weight.chunk(3), biases))
    scores = q @ k.mT / math.sqrt(q.shape[-1])  # (N, H, L, S)
    if key_padding_mask is not None:  # True = padding, nn.MultiheadAttention's way
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    output = F.linear(merge_heads(scores.softmax(dim=-1) @ v), out_proj_weight, out_proj_bias)
    return output if batch_first else output.transpose(0, 1)


def parameter_count(d_model, num_heads, bias=True):
    weights = 3 * d_model * d_model + d_model * d_model  # qkv, then out
    biases = 3 * d_model + d_model if bias else 0
    return weights + biases
