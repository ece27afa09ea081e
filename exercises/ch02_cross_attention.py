"""Chapter 2: cross-attention and padding masks.

Fill in the body of each function (the lines that raise NotImplementedError).
Read chapters/02_cross_attention/README.md first; grade your work with

    mha-course grade ch02

Conventions used in every exercise of this chapter:

* Batches come first: a batch of ``B`` sequences of ``L`` query tokens is
  ``(B, L, d_x)``, the context the queries read from is ``(B, S, d_c)``.
* Sequences in a batch have different lengths; shorter ones are padded at
  the end up to the longest. ``lengths[b]`` is the number of real tokens of
  sequence ``b``.
* A boolean mask is True where a query MAY attend to a key, as in chapter 1
  and ``torch.nn.functional.scaled_dot_product_attention``.
* A query whose keys are all masked gets zero weights and a zero output.

You may call ``torch.softmax`` and ``F.scaled_dot_product_attention`` here:
chapter 1 graded your own versions of them.
"""

import math

import torch

MASK_CONVENTIONS = ("attend", "block", "additive")


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """Which positions of a padded batch hold real tokens.

    Args:
        lengths: int64 tensor of shape ``(B,)``: real length of each sequence.
        max_len: the padded length ``S``; ``None`` means ``lengths.max()``.

    Returns:
        A bool tensor of shape ``(B, S)``, True at positions ``s < lengths[b]``
        (real tokens) and False at padding, on the device of ``lengths``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def convert_mask(
    mask: torch.Tensor,
    source: str,
    target: str,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Rewrite a mask from one convention to another.

    The conventions, named as in ``MASK_CONVENTIONS``:

    * ``"attend"``: bool, True where the query may attend (this course,
      ``F.scaled_dot_product_attention``);
    * ``"block"``: bool, True where the key is hidden (``nn.MultiheadAttention``'s
      ``key_padding_mask`` and ``attn_mask``);
    * ``"additive"``: float, added to the scores: ``0`` keeps a key and
      ``-inf`` hides it. When reading an additive mask, every entry that is
      not ``-inf`` counts as kept.

    Args:
        mask: a tensor of any shape in the ``source`` convention.
        source, target: convention names.
        dtype: the float dtype of an ``"additive"`` result.

    Returns:
        The same mask, same shape and device, in the ``target`` convention:
        bool for ``"attend"`` and ``"block"``; for ``"additive"``, ``dtype``
        holding exactly ``0.0`` and ``-inf``.

    Raises:
        ValueError: for a convention name not in ``MASK_CONVENTIONS``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def combine_masks(key_padding: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One mask for multi-head scores of shape ``(B, H, L, S)``.

    Args:
        key_padding: bool ``(B, S)``, True at real keys (``padding_mask``).
        attn_mask: optional bool mask, True where query i may attend to key j,
            either ``(L, S)`` (the same for every sequence) or ``(B, L, S)``.

    Returns:
        A bool tensor True where both masks allow attending: shape
        ``(B, 1, L, S)``, or ``(B, 1, 1, S)`` without ``attn_mask``. The
        sizes of 1 broadcast over the heads (and the queries), so the result
        can be used with ``(B, H, L, S)`` scores directly.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def cross_attention(
    x: torch.Tensor,
    context: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    context_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-head cross-attention: queries from ``x``, keys and values from ``context``.

    Projection weights are stored the way ``nn.Linear`` stores them,
    ``(d_out, d_in)``, so the queries are ``x @ w_q.T``.

    Args:
        x: the sequence that asks, shape ``(B, L, d_x)``.
        context: the sequence it reads, shape ``(B, S, d_c)``; ``d_c`` may
            differ from ``d_x`` and ``S`` from ``L``.
        w_q: shape ``(d_k, d_x)``.
        w_k: shape ``(d_k, d_c)``.
        w_v: shape ``(d_v, d_c)``.
        context_lengths: optional int64 ``(B,)``: the real length of each
            context; keys at positions ``>= context_lengths[b]`` are padding
            and get zero weight. Padding of the context hides keys only:
            every query still gets an output.

    Returns:
        ``(output, weights)`` of shapes ``(B, L, d_v)`` and ``(B, L, S)``.
        A sequence whose context is empty (length 0) gets zero weights and
        a zero output.
    """
    # YOUR CODE HERE
    raise NotImplementedError
