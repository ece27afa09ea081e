"""Chapter 1: scaled dot-product self-attention.

Fill in the body of each function (the lines that raise NotImplementedError).
Read chapters/01_self_attention/README.md first; grade your work with

    mha-course grade ch01

Conventions used in every exercise of this chapter:

* Shapes are written as ``(..., L, d_k)``: ``...`` is any number of leading
  batch dimensions (none, one or several), ``L`` the number of queries, ``S``
  the number of keys and values, ``d_k`` the query/key width, ``d_v`` the
  value width. ``L`` and ``S`` may differ.
* A boolean mask is True where a query MAY attend to a key, as in
  ``torch.nn.functional.scaled_dot_product_attention``. A float mask is added
  to the scores (0 keeps a key, ``-inf`` removes it).
* A query row whose keys are all masked gets zero weights and a zero output.
"""

import math

import numpy as np
import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax of ``x`` along ``dim``.

    Args:
        x: a float tensor of any shape; entries may be ``-inf`` (masked).
        dim: the dimension whose entries are turned into probabilities.

    Returns:
        A tensor of the same shape and dtype as ``x``: non-negative entries
        that sum to 1 along ``dim``.

    Do not call ``torch.softmax``, ``Tensor.softmax`` or
    ``torch.nn.functional.softmax``: this exercise is to write it.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention ``softmax(q @ k^T * scale + mask) @ v``.

    Args:
        q: queries, shape ``(..., L, d_k)``.
        k: keys, shape ``(..., S, d_k)``.
        v: values, shape ``(..., S, d_v)``.
        mask: optional, broadcastable to ``(..., L, S)``. Boolean: True where
            query i may attend to key j. Float: added to the scores.
        scale: multiplies the scores; ``None`` means ``1 / sqrt(d_k)``.

    Returns:
        ``(output, weights)``: output of shape ``(..., L, d_v)`` and the
        attention weights of shape ``(..., L, S)``, each row summing to 1,
        except rows whose keys are all masked: those weights and that output
        are zeros.

    You may use your ``softmax`` above (or ``torch.softmax``), but not
    ``torch.nn.functional.scaled_dot_product_attention``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def self_attention(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-head self-attention: queries, keys and values all come from ``x``.

    The projection weights are stored the way ``nn.Linear`` stores them,
    ``(d_out, d_in)``, so the queries are ``x @ w_q.T``.

    Args:
        x: input tokens, shape ``(..., T, d_model)``.
        w_q: query projection, shape ``(d_k, d_model)``.
        w_k: key projection, shape ``(d_k, d_model)``.
        w_v: value projection, shape ``(d_v, d_model)``.
        mask: optional, broadcastable to ``(..., T, T)``, as in
            ``scaled_dot_product_attention``.

    Returns:
        ``(output, weights)`` of shapes ``(..., T, d_v)`` and ``(..., T, T)``.

    Use your ``scaled_dot_product_attention`` above.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def softmax_numpy(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The stable softmax of ``softmax`` above, in NumPy.

    Args:
        x: a float array of any shape; entries may be ``-inf``.
        axis: the axis whose entries are turned into probabilities.

    Returns:
        An array of the same shape and dtype as ``x``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def scaled_dot_product_attention_numpy(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``scaled_dot_product_attention`` in NumPy, with the default scale.

    Args:
        q: queries, shape ``(..., L, d_k)``.
        k: keys, shape ``(..., S, d_k)``.
        v: values, shape ``(..., S, d_v)``.
        mask: optional boolean array broadcastable to ``(..., L, S)``,
            True where query i may attend to key j.

    Returns:
        ``(output, weights)`` as NumPy arrays of shapes ``(..., L, d_v)`` and
        ``(..., L, S)``, in the dtype of ``q``; fully masked rows are zeros.

    Use your ``softmax_numpy`` above; no torch in this one.
    """
    # YOUR CODE HERE
    raise NotImplementedError
