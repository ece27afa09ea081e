"""Chapter 3: multi-head attention.

Fill in the body of each function and method (the lines that raise
NotImplementedError). Read chapters/03_multi_head_attention/README.md first;
grade your work with

    mha-course grade ch03

Conventions used in every exercise of this chapter:

* Shapes are ``(..., T, D)``: any leading batch dimensions, ``T`` tokens,
  ``D`` features. ``H`` heads each get ``d = D // H`` features; split
  tensors are ``(..., H, T, d)``.
* Head ``h`` owns features ``h * d`` to ``(h + 1) * d`` of a projection's
  output, as in ``nn.MultiheadAttention``.
* Projection weights are stored the way ``nn.Linear`` stores them,
  ``(d_out, d_in)``: a projection of ``x`` is ``x @ w.T``.
* A boolean mask is True where a query MAY attend to a key. A query whose
  keys are all masked gets zero weights and a zero output.

You may call ``torch.softmax`` and ``F.scaled_dot_product_attention``
(chapter 1 graded your own versions), but not ``nn.MultiheadAttention`` or
``F.multi_head_attention_forward``: this chapter is to write them.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Split the last dimension into heads and move the heads before the tokens.

    Args:
        x: shape ``(..., T, D)``, with ``D`` divisible by ``num_heads``.
        num_heads: ``H``.

    Returns:
        Shape ``(..., H, T, D // H)``: ``result[..., h, t, :]`` is
        ``x[..., t, h * d:(h + 1) * d]``.

    Raises:
        ValueError: when ``D`` is not divisible by ``num_heads``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Undo ``split_heads``: concatenate the heads' features, token by token.

    Args:
        x: shape ``(..., H, T, d)``.

    Returns:
        Shape ``(..., T, H * d)``, head ``h`` in features ``h * d`` to
        ``(h + 1) * d``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def multi_head_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    num_heads: int,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Multi-head attention from explicit projection weights.

    Args:
        query: shape ``(..., L, d_q)``.
        key: shape ``(..., S, d_kin)``.
        value: shape ``(..., S, d_vin)``.
        num_heads: ``H``; ``D`` and ``D_v`` below are divisible by it.
        w_q: shape ``(D, d_q)``.
        w_k: shape ``(D, d_kin)``.
        w_v: shape ``(D_v, d_vin)``.
        w_o: output projection, shape ``(d_out, D_v)``.
        mask: optional bool, broadcastable to ``(..., H, L, S)``; e.g.
            ``(L, S)`` for every head and sequence alike.

    Returns:
        Shape ``(..., L, d_out)``. Each head attends with the scale
        ``1 / sqrt(D // H)``: the width of one head, not of the model.
    """
    # YOUR CODE HERE
    raise NotImplementedError


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with one fused projection for q, k and v.

    The grader loads weights by name, so keep these attributes:

    * ``qkv``: ``nn.Linear(d_model, 3 * d_model, bias=bias)``; its weight
      stacks ``[W_q; W_k; W_v]``, like ``nn.MultiheadAttention``'s
      ``in_proj_weight`` of shape ``(3 * d_model, d_model)``.
    * ``out``: ``nn.Linear(d_model, d_model, bias=bias)``.

    Args:
        d_model: ``D``, divisible by ``num_heads``.
        num_heads: ``H``.
        bias: whether both projections have a bias.
        dropout: probability of zeroing an attention weight while training
            (``self.training``); weights are rescaled by ``1 / (1 - p)`` as
            ``F.dropout`` does. Never applied to the output.
    """

    def __init__(self, d_model: int, num_heads: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        # YOUR CODE HERE
        raise NotImplementedError

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Self-attention over ``x``.

        Args:
            x: shape ``(..., T, D)``.
            mask: optional bool, broadcastable to ``(..., H, T, T)``.
            need_weights: also return the attention weights.

        Returns:
            The output, shape ``(..., T, D)``; with ``need_weights``,
            ``(output, weights)`` where ``weights`` has shape
            ``(..., H, T, T)``, one matrix per head (not averaged), and holds
            the weights the values were actually averaged with (after
            dropout).
        """
        # YOUR CODE HERE
        raise NotImplementedError


def torch_multihead_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    num_heads: int,
    in_proj_weight: torch.Tensor,
    in_proj_bias: torch.Tensor | None,
    out_proj_weight: torch.Tensor,
    out_proj_bias: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None = None,
    batch_first: bool = False,
) -> torch.Tensor:
    """What ``nn.MultiheadAttention(E, num_heads)(query, key, value)[0]`` computes,
    from that module's parameters and in its conventions.

    Args:
        query: ``(L, N, E)``, or ``(N, L, E)`` when ``batch_first``.
        key, value: ``(S, N, E)``, or ``(N, S, E)`` when ``batch_first``.
        num_heads: ``H``, dividing ``E``.
        in_proj_weight: ``(3E, E)``, the rows of ``W_q``, then ``W_k``, then ``W_v``.
        in_proj_bias: ``(3E,)`` in the same order, or None.
        out_proj_weight: ``(E, E)``; out_proj_bias: ``(E,)`` or None.
        key_padding_mask: optional bool ``(N, S)`` in ``nn.MultiheadAttention``'s
            convention: True marks a key to IGNORE. Every sequence keeps at
            least one key.
        batch_first: the layout of inputs and output, as the module's flag.

    Returns:
        The attention output in the layout of ``query``: ``(L, N, E)``, or
        ``(N, L, E)`` when ``batch_first``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def parameter_count(d_model: int, num_heads: int, bias: bool = True) -> int:
    """How many numbers ``MultiHeadAttention(d_model, num_heads, bias)`` learns.

    Returns:
        The total size of its parameters, as an int.
    """
    # YOUR CODE HERE
    raise NotImplementedError
