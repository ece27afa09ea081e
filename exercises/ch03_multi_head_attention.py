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
  keys are all masked gets zero weights and a zero attention output (what
  an output projection's bias adds to it stays).
* Precision, the course's rule: a function returns floating results in the
  dtype of its floating inputs. float32 and float64 inputs get float32's
  accuracy: inside, a function may compute in float32 or wider (computing
  float64 inputs in float32, as llama's ``.float()`` does, is allowed), and
  the checks compare float64 results at float32's tolerance. float16 and
  bfloat16 results are compared at those dtypes' looser tolerance; computing
  them in float32 inside is good practice. Each docstring's "Dtypes:" line
  says which dtypes the function is given.
* Gradients: ``multi_head_attention`` (in float64, with respect to query,
  key, value and the four weights) and ``MultiHeadAttention`` (with
  respect to ``x``) are differentiated by autograd; keep them in the graph.
* Devices: inputs come on the CPU or on a GPU; make any new tensor on the
  inputs' device (``device=x.device``) and return results there.

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

    Dtypes: float32 or float64; the result has ``x``'s dtype (its entries are
    ``x``'s, moved).

    Args:
        x: shape ``(..., T, D)``, no batch dimension or several.
        num_heads: ``H``, 1 included.

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

    Dtypes: float32 or float64; the result has ``x``'s dtype (its entries are
    ``x``'s, moved).

    Args:
        x: shape ``(..., H, T, d)``: ``(H, T, d)`` with no batch dimension,
            or several batch dimensions.

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

    Dtypes: the tensors float32 or float64, one dtype, and a bool ``mask``;
    the result has ``query``'s dtype (the course's precision rule).

    Args:
        query: shape ``(..., L, d_q)``, no batch dimension or several.
        key: shape ``(..., S, d_kin)``, the same batch dimensions.
        value: shape ``(..., S, d_vin)``.
        num_heads: ``H``; ``D`` and ``D_v`` below are divisible by it.
        w_q: shape ``(D, d_q)``.
        w_k: shape ``(D, d_kin)``.
        w_v: shape ``(D_v, d_vin)``.
        w_o: output projection, shape ``(d_out, D_v)``.
        mask: optional bool, broadcastable to ``(..., H, L, S)``: ``(L, S)``
            for every head and sequence alike, ``(B, 1, L, S)`` per sequence,
            ``(B, H, L, S)`` per head.

    Returns:
        Shape ``(..., L, d_out)``. Each head attends with the scale
        ``1 / sqrt(D // H)``: the width of one head, not of the model. A
        query whose keys are all masked (in every head) gets a zero output.
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

        Dtypes: ``x`` in the dtype of the module's parameters (float32 in the
        checks); the results have that dtype.

        Args:
            x: shape ``(..., T, D)``: ``(T, D)`` with no batch dimension, or
                several batch dimensions.
            mask: optional bool, broadcastable to ``(..., H, T, T)``: ``(T, T)``
                for every head and sequence alike, ``(B, 1, T, T)`` per
                sequence, ``(B, H, T, T)`` per head.
            need_weights: also return the attention weights.

        Returns:
            The output, shape ``(..., T, D)``; with ``need_weights``,
            ``(output, weights)`` where ``weights`` has shape
            ``(..., H, T, T)``, one matrix per head (not averaged), and holds
            the weights the values were actually averaged with (after
            dropout). A query whose keys are all masked gets zero weights,
            not NaN, so its output is ``out``'s bias.
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

    Dtypes: the tensors float32, one dtype, and a bool ``key_padding_mask``;
    the result has ``query``'s dtype (the course's precision rule).

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

    A formula in ``d_model`` and ``bias``: build no module and no tensor
    (this exercise may not call torch), so that it answers at once even for
    ``d_model = 1_000_000``, a model too big to build.

    Dtypes: ints (and a bool) in, a Python ``int`` out.

    Returns:
        The total size of its parameters, as a Python ``int``.
    """
    # YOUR CODE HERE
    raise NotImplementedError
