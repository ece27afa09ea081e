"""Chapter 7: memory-efficient attention (the idea behind FlashAttention).

Fill in the body of each function (the lines that raise NotImplementedError).
Read chapters/07_memory_efficient_attention/README.md first; grade your work with

    mha-course grade ch07

Conventions used in every exercise of this chapter:

* Queries ``q`` have shape ``(..., L, d)``, keys ``k`` ``(..., S, d)`` and
  values ``v`` ``(..., S, d_v)``; the leading dimensions are batch (and
  head) dimensions, the same for all three. The scale is ``1 / sqrt(d)``.
* Keys are processed in blocks of ``block_size`` consecutive keys: keys
  ``0 .. block_size - 1``, then the next ``block_size``, and so on; the last
  block is shorter when ``block_size`` does not divide ``S``.
* Causal is chapter 4's bottom-right alignment: query ``i`` sits at position
  ``i + S - L`` and sees keys ``0 .. i + S - L``. A query with no key to see
  (``L > S``) gets a zero output.
* Memory is the point: ``tiled_attention`` never builds the ``(L, S)`` score
  matrix (nor an ``(L, S)`` mask), only ``(L, block_size)`` pieces of it,
  and neither takes a max or sum over more than one block of keys (of a
  row, for ``online_softmax``). The grader measures the largest tensor your code makes and the most
  numbers one max, sum or matrix product combines.
* Precision, the course's rule: a function returns floating results in the
  dtype of its floating inputs. float32 and float64 inputs get float32's
  accuracy: inside, a function may compute in float32 or wider (computing
  float64 inputs in float32, as llama's ``.float()`` does, is allowed), and
  the checks compare float64 results at float32's tolerance. float16 and
  bfloat16 results are compared at those dtypes' looser tolerance; computing
  them in float32 inside is good practice. Each docstring's "Dtypes:" line
  says which dtypes the function is given.
* Devices: inputs come on the CPU or on a GPU; make any new tensor (running
  max, sum, output) on the inputs' device (``device=q.device``) and return
  results there.

You may not call ``torch.softmax`` (or its relatives) nor
``F.scaled_dot_product_attention``: this chapter is how they can be written.
"""

import math

import torch


def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Softmax over the last dimension, reading ``x`` one block at a time.

    A first pass over the blocks keeps, for every row, the running maximum
    ``m`` and the running sum ``l`` of ``exp(x - m)``; when a block raises the
    maximum, the sum so far is rescaled by ``exp(m_old - m_new)``. A second
    pass divides ``exp(x - m)`` by ``l``.

    Dtypes: float32 or float64; the result has ``x``'s dtype (the course's
    precision rule).

    Args:
        x: finite numbers, shape ``(..., N)`` (one leading dimension or
            several, ``N`` from 1), any size of logits (1e4 too).
        block_size: how many entries of a row each step reads, ``>= 1``;
            it need not divide ``N`` and may exceed it (one block).

    Returns:
        Shape ``(..., N)``, equal to ``torch.softmax(x, dim=-1)``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_size: int,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention over blocks of keys, with an online softmax.

    For each block of keys: its scores ``(..., L, block)``, the new running
    max ``m`` and sum ``l`` of every query, and the running output ``acc``
    (the weighted sum of values, not yet divided by ``l``), rescaled by
    ``exp(m_old - m_new)`` whenever the max grows. At the end, ``acc / l``,
    and the log-sum-exp ``m + log l`` that ``merge_attention`` needs.

    Dtypes: ``q``, ``k``, ``v`` float32 or float64, one dtype; both results
    have ``q``'s dtype (the course's precision rule).

    Args:
        q: queries, shape ``(..., L, d)``.
        k: keys, shape ``(..., S, d)``.
        v: values, shape ``(..., S, d_v)``.
        block_size: keys per block, ``>= 1`` (any size; ``>= S`` is one block).
        causal: when True, query ``i`` sees keys ``0 .. i + S - L`` only
            (bottom-right, as in chapter 4); ``L`` may exceed ``S``, and a
            query that sees no key gets zeros, not NaN.

    Returns:
        ``(out, lse)``, without ever making a tensor of ``L x S`` numbers:

        * ``out``, shape ``(..., L, d_v)``: ``softmax(q k^T / sqrt(d)) v``;
          zeros for a query that sees no key.
        * ``lse``, shape ``(..., L)``: for each query, the log of the sum of
          ``exp(score)`` over the keys it sees, ``score = q . k / sqrt(d)``
          (masked keys left out); ``-inf`` for a query that sees no key.

        Both finite for scores in the thousands (no overflow), and as
        accurate as float32 rounding of such scores allows.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def merge_attention(
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over two sets of keys, from the attention over each set.

    ``out_a`` is the attention output of some queries over keys A,
    ``lse_a`` the log of the sum of ``exp(score)`` over those keys (for each
    query): what ``tiled_attention`` over keys A returns; the same for B.
    This is how the pieces of split-KV attention (Flash-Decoding, ring
    attention) are put together.

    Dtypes: the four tensors float32, one dtype; both results have
    ``out_a``'s dtype (the course's precision rule).

    Args:
        out_a, out_b: shape ``(..., L, d_v)``.
        lse_a, lse_b: shape ``(..., L)``, the log-sum-exp of the scaled
            scores ``q k^T / sqrt(d)``; they may be in the hundreds, where
            ``exp`` of them overflows. ``-inf`` for a query with no key in
            that set, whose output there is zeros (every query has a key in
            at least one of them).

    Returns:
        ``(out, lse)`` of shapes ``(..., L, d_v)`` and ``(..., L)``: the
        attention output over keys A and B together, and its log-sum-exp.
    """
    # YOUR CODE HERE
    raise NotImplementedError
