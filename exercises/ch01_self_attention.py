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
* A query row whose keys are all masked (all False, or all ``-inf`` in a
  float mask) gets zero weights and a zero output.
* Precision, the course's rule: a function returns floating results in the
  dtype of its floating inputs. float32 and float64 inputs get float32's
  accuracy: inside, a function may compute in float32 or wider (computing
  float64 inputs in float32, as llama's ``.float()`` does, is allowed), and
  the checks compare float64 results at float32's tolerance. float16 and
  bfloat16 results are compared at those dtypes' looser tolerance; computing
  them in float32 inside is good practice. Each docstring's "Dtypes:" line
  says which dtypes the function is given.
* Gradients: ``softmax``, ``scaled_dot_product_attention`` and
  ``self_attention`` are differentiated by autograd (in float64) with
  respect to their float tensor inputs, masks aside; keep them in the graph (no
  ``.detach()`` of what the result depends on, no NumPy round trip).
* Devices: the torch functions get their inputs on the CPU or on a GPU; make
  any new tensor on the inputs' device (``device=x.device``) and return
  results there.
"""

import math

import numpy as np
import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax of ``x`` along ``dim``.

    Dtypes: float32 or float64; the result has ``x``'s dtype (the course's
    precision rule).

    Args:
        x: a float tensor of any shape (one dimension or several, sizes of 1
            too); entries may be ``-inf`` (masked), and finite entries as
            large as ``±1e4`` must not overflow.
        dim: the dimension whose entries are turned into probabilities,
            negative (from the end) or not.

    Returns:
        A tensor of the same shape and dtype as ``x``: non-negative entries
        that sum to 1 along ``dim``, exactly 0 where ``x`` is ``-inf``. A
        slice along ``dim`` whose entries are all ``-inf`` has no
        distribution: it is NaN in every entry (as ``torch.softmax`` gives);
        the other slices are unaffected.

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

    Dtypes: ``q``, ``k``, ``v`` (and a float ``mask``) float32 or float64,
    one dtype; both results have ``q``'s dtype (the course's precision rule).

    Args:
        q: queries, shape ``(..., L, d_k)``.
        k: keys, shape ``(..., S, d_k)``.
        v: values, shape ``(..., S, d_v)``.
        mask: optional, broadcastable to ``(..., L, S)``: ``(L, S)`` for
            every batch alike, or one per batch. Boolean: True where query i
            may attend to key j. Float: added to the scores (0 keeps a key,
            ``-inf`` removes it).
        scale: multiplies the scores; ``None`` means ``1 / sqrt(d_k)``.

    Returns:
        ``(output, weights)``: output of shape ``(..., L, d_v)`` and the
        attention weights of shape ``(..., L, S)``, each row summing to 1
        and exactly 0 on masked keys, except rows whose keys are all masked:
        those weights and that output are zeros, not NaN. Finite for scores
        as large as ``±1e4``.

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

    Dtypes: ``x`` and the weights float32 or float64, one dtype; both results
    have ``x``'s dtype (the course's precision rule).

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

    Dtypes: float32 or float64; the result has ``x``'s dtype (the course's
    precision rule).

    Args:
        x: a float array of any shape; entries may be ``-inf``, and finite
            entries as large as ``±1e4``.
        axis: the axis whose entries are turned into probabilities, negative
            (from the end) or not.

    Returns:
        An array of the same shape and dtype as ``x``: non-negative entries
        that sum to 1 along ``axis``, exactly 0 where ``x`` is ``-inf``. A
        slice along ``axis`` whose entries are all ``-inf`` is NaN in every
        entry, as in ``softmax`` (NumPy may warn of an invalid value); the
        other slices are unaffected.
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

    Dtypes: ``q``, ``k``, ``v`` float32 or float64, one dtype; both results
    have ``q``'s dtype (the course's precision rule).

    Args:
        q: queries, shape ``(..., L, d_k)``.
        k: keys, shape ``(..., S, d_k)``.
        v: values, shape ``(..., S, d_v)``.
        mask: optional boolean array broadcastable to ``(..., L, S)``,
            True where query i may attend to key j.

    Returns:
        ``(output, weights)`` as NumPy arrays of shapes ``(..., L, d_v)`` and
        ``(..., L, S)``, in the dtype of ``q``; a query whose keys are all
        masked gets zero weights and a zero output, not NaN.

    Use your ``softmax_numpy`` above; no torch in this one.
    """
    # YOUR CODE HERE
    raise NotImplementedError
