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
* Precision, the course's rule: a function returns floating results in the
  dtype of its floating inputs. float32 and float64 inputs get float32's
  accuracy: inside, a function may compute in float32 or wider (computing
  float64 inputs in float32, as llama's ``.float()`` does, is allowed), and
  the checks compare float64 results at float32's tolerance. float16 and
  bfloat16 results are compared at those dtypes' looser tolerance; computing
  them in float32 inside is good practice. Each docstring's "Dtypes:" line
  says which dtypes the function is given.
* Gradients: ``cross_attention`` is differentiated by autograd (in float64)
  with respect to ``x``, ``context`` and the weights; keep them in the graph.
* Devices: inputs come on the CPU or on a GPU; make any new tensor on the
  inputs' device (``device=lengths.device``) and return results there.

You may call ``torch.softmax`` and ``F.scaled_dot_product_attention`` here:
chapter 1 graded your own versions of them.
"""

import math

import torch

MASK_CONVENTIONS = ("attend", "block", "additive")


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """Which positions of a padded batch hold real tokens.

    Dtypes: ``lengths`` int64; the result is bool.

    Args:
        lengths: int64 tensor of shape ``(B,)``: real length of each
            sequence, 0 included. ``B`` may be 0, a batch of no sequences,
            when ``max_len`` is given.
        max_len: the padded length ``S``, at least every length; ``None``
            means ``lengths.max()`` (never with ``B = 0``: a batch of no
            sequences has no longest one).

    Returns:
        A bool tensor of shape ``(B, S)``, True at positions ``s < lengths[b]``
        (real tokens) and False at padding, on the device of ``lengths``.
        With ``max_len=None`` and every length 0, that is ``(B, 0)``; a
        batch of no sequences gives the empty ``(0, S)``.
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

    Dtypes: an ``"attend"`` or ``"block"`` mask is bool, an ``"additive"``
    one float (float32 in the checks); the result is bool, or ``dtype`` for
    ``"additive"`` (float32, float64 or float16), whatever the mask's dtype.

    Args:
        mask: a tensor of any shape (any number of dimensions) in the
            ``source`` convention; rows may be entirely blocked.
        source, target: convention names; they may be equal.
        dtype: the float dtype of an ``"additive"`` result.

    Returns:
        The same mask, same shape and device, in the ``target`` convention:
        bool for ``"attend"`` and ``"block"``; for ``"additive"``, ``dtype``
        holding exactly ``0.0`` and ``-inf``, also when ``source`` is
        ``"additive"`` (its finite entries, whatever they are, become 0.0).

    Raises:
        ValueError: for a convention name not in ``MASK_CONVENTIONS``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def combine_masks(key_padding: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One mask for multi-head scores of shape ``(B, H, L, S)``.

    Dtypes: bool masks in, a bool mask out.

    Args:
        key_padding: bool ``(B, S)``, True at real keys (``padding_mask``);
            a row may be all False (a sequence of length 0).
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

    Dtypes: ``x``, ``context`` and the weights float32 or float64, one dtype;
    ``context_lengths`` int64; both results have ``x``'s dtype (the course's
    precision rule).

    Args:
        x: the sequence that asks, shape ``(B, L, d_x)``.
        context: the sequence it reads, shape ``(B, S, d_c)``; ``d_c`` may
            differ from ``d_x`` and ``S`` from ``L``.
        w_q: shape ``(d_k, d_x)``.
        w_k: shape ``(d_k, d_c)``.
        w_v: shape ``(d_v, d_c)``.
        context_lengths: optional int64 ``(B,)``: the real length of each
            context, from 0 to ``S``; keys at positions
            ``>= context_lengths[b]`` are padding and get exactly zero weight,
            whatever the padded tokens hold. Padding of the context hides
            keys only: every query still gets an output. ``None`` (or all
            lengths ``S``): every key is real.

    Returns:
        ``(output, weights)`` of shapes ``(B, L, d_v)`` and ``(B, L, S)``;
        each query's weights sum to 1 over its real keys. A sequence whose
        context is empty (length 0) gets zero weights and a zero output, not
        NaN, and zero gradients. ``B`` is at least 1.
    """
    # YOUR CODE HERE
    raise NotImplementedError
