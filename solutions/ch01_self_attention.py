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
    # BEGIN SOLUTION
    # exp(1000) overflows to inf and inf / inf is nan. Subtracting the largest
    # entry first leaves the result unchanged (the factor exp(-max) cancels)
    # and makes every exponent <= 0, so exp never overflows.
    shift = x.amax(dim=dim, keepdim=True).detach()
    # A row that is entirely -inf has max -inf and -inf - -inf is nan: shift
    # such rows by 0 instead (their softmax stays undefined, as in torch).
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    exps = torch.exp(x - shift)
    return exps / exps.sum(dim=dim, keepdim=True)
    # END SOLUTION


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
    # BEGIN SOLUTION
    if scale is None:
        # Scores are sums of d_k products; dividing by sqrt(d_k) keeps their
        # variance near 1 so the softmax does not saturate as d_k grows.
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale  # (..., L, S)
    if mask is not None:
        if mask.dtype == torch.bool:
            # -inf, not a large negative number: exp(-inf) is exactly 0, so a
            # masked key gets exactly zero weight whatever the other scores.
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    # A row with every key masked is all -inf, and its softmax is 0/0 = nan.
    # The course's rule (PyTorch's too) is that such a query attends to
    # nothing: zero weights, hence zero output. Giving the row finite scores
    # before the softmax keeps nan out of the forward and the backward pass.
    no_keys = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., L, 1)
    weights = softmax(scores.masked_fill(no_keys, 0.0), dim=-1)  # (..., L, S)
    weights = weights.masked_fill(no_keys, 0.0)
    return weights @ v, weights  # (..., L, d_v), (..., L, S)
    # END SOLUTION


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
    # BEGIN SOLUTION
    q = x @ w_q.T  # (..., T, d_k)
    k = x @ w_k.T  # (..., T, d_k)
    v = x @ w_v.T  # (..., T, d_v)
    return scaled_dot_product_attention(q, k, v, mask=mask)
    # END SOLUTION


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
    # BEGIN SOLUTION
    shift = np.max(x, axis=axis, keepdims=True)
    shift = np.where(np.isfinite(shift), shift, 0)
    exps = np.exp(x - shift)
    return exps / np.sum(exps, axis=axis, keepdims=True)
    # END SOLUTION


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
    # BEGIN SOLUTION
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ np.swapaxes(k, -2, -1) * scale  # (..., L, S)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    no_keys = np.all(np.isneginf(scores), axis=-1, keepdims=True)  # (..., L, 1)
    weights = softmax_numpy(np.where(no_keys, 0, scores), axis=-1)  # (..., L, S)
    weights = np.where(no_keys, 0, weights)
    return weights @ v, weights  # (..., L, d_v), (..., L, S)
    # END SOLUTION
