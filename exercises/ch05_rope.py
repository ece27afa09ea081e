"""Chapter 5: rotary position embeddings (RoPE).

Fill in the body of each function (the lines that raise NotImplementedError).
Read chapters/05_rope/README.md first; grade your work with

    mha-course grade ch05

Conventions used in every exercise of this chapter:

* Vectors to rotate have an even width ``d`` (one head's width). Rotation
  ``k`` (``k = 0 .. d/2 - 1``, counted from 0) turns a pair of features by
  the angle ``position * theta ** (-2k / d)``; ``theta`` is 10000 unless
  said otherwise.
* Angles are computed in float32 (``position`` times frequency), whatever
  the dtype of the vectors: in float16 a position like 1000 times a
  frequency loses the angle entirely. The rotated vectors come back in the
  dtype they came in.
* Precision, the course's rule: a function returns floating results in the
  dtype of its floating inputs. float32 and float64 inputs get float32's
  accuracy: inside, a function may compute in float32 or wider (computing
  float64 inputs in float32, as llama's ``.float()`` does, is allowed (the
  angles are float32 anyway)), and the checks compare float64 results at
  float32's tolerance. float16 and bfloat16 results are compared at those
  dtypes' looser tolerance; computing them in float32 inside is good practice.
  Each docstring's "Dtypes:" line says which dtypes the function is given.
* ``token_positions`` holds each token's position (int64). Positions need
  not be 0, 1, 2, ...: a chunk may start at an offset, and a batch may hold
  any positions at all.
* Heads as in chapter 3; weights in ``nn.Linear`` layout ``(d_out, d_in)``.
* Gradients: ``apply_rope`` (with respect to ``x``) and
  ``rope_self_attention`` (with respect to ``x`` and the four weights) are
  differentiated by autograd; keep them in the graph.
* Devices: inputs come on the CPU or on a GPU; make any new tensor on the
  inputs' device (``device=x.device``) and return results there.

You may call ``torch.softmax`` and ``F.scaled_dot_product_attention``, but
not ``nn.MultiheadAttention``.
"""

import math

import torch


def rope_angles(token_positions: torch.Tensor, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """The rotation angles of every token and every pair of features.

    Dtypes: ``token_positions`` int64; the result is float32.

    Args:
        token_positions: int64, shape ``(..., T)``: no batch dimension or
            several; positions as large as 100000.
        head_dim: ``d``, even.
        theta: the base of the frequencies (a Python float).

    Returns:
        float32, shape ``(..., T, d // 2)``: entry ``k`` of token ``t`` is
        ``token_positions[..., t] * theta ** (-2k / d)``, on the device of
        ``token_positions``.

    Raises:
        ValueError: when ``head_dim`` is odd.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def apply_rope(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate adjacent pairs ``(x[2k], x[2k + 1])``: the convention of the
    RoPE paper, Meta's LLaMA and Stanford CS336.

    Dtypes: ``x`` float32, float64, float16 or bfloat16, ``token_positions``
    int64; the result has ``x``'s dtype (the course's precision rule; the
    angles are float32 whatever ``x``'s dtype).

    Args:
        x: shape ``(..., T, d)``, ``d`` even.
        token_positions: int64, broadcastable to ``x.shape[:-1]``: ``(T,)``
            for every sequence alike, ``(B, T)`` per sequence, or
            ``(B, 1, T)`` for ``x`` of shape ``(B, H, T, d)``. Positions
            may come in any order, with gaps, and be in the thousands.
        theta: the base of the frequencies.

    Returns:
        Shape and dtype of ``x``: for each k,
        ``out[2k] = x[2k] cos a - x[2k+1] sin a`` and
        ``out[2k+1] = x[2k] sin a + x[2k+1] cos a``, with ``a`` the angle of
        pair k at the token's position.

    Raises:
        ValueError: when ``d`` is odd, as ``rope_angles``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def apply_rope_half(x: torch.Tensor, token_positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate the pairs ``(x[k], x[k + d/2])``: the "rotate_half" convention
    of GPT-NeoX and Hugging Face.

    Dtypes, args, returns and errors as ``apply_rope``; pair k (features k
    and k + d/2) turns by the same angle as pair k of ``apply_rope``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def adjacent_to_half_permutation(head_dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The feature order that turns one convention into the other.

    Dtypes: the result is int64.

    Args:
        head_dim: ``d``, even.
        device: where to create the result; ``None`` means the default
            device.

    Returns:
        int64, shape ``(d,)``: ``perm`` such that, for every ``x``,
        ``apply_rope_half(x[..., perm], p) == apply_rope(x, p)[..., perm]``.
        It gathers the first feature of every adjacent pair, then the
        second ones. Created on ``device``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def rope_self_attention(
    d_model: int,
    num_heads: int,
    max_seq_len: int,
    theta: float,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    x: torch.Tensor,
    token_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal multi-head self-attention with RoPE on queries and keys.

    Dtypes: ``x`` and the weights float32, one dtype; ``token_positions``
    int64; the result has ``x``'s dtype (the course's precision rule).

    Args:
        d_model: ``D``, the width of ``x`` and of every projection.
        num_heads: ``H``; each head has ``d = D // H`` features (even).
        max_seq_len: every position must be below this.
        theta: the RoPE base.
        w_q, w_k, w_v, w_o: shape ``(D, D)`` each, ``nn.Linear`` layout.
        x: shape ``(..., T, D)``: ``(T, D)`` with no batch dimension, or
            several batch dimensions.
        token_positions: int64, broadcastable to ``x.shape[:-1]``: ``(T,)``
            for every sequence alike, or ``(..., T)`` per sequence; positions
            in any order, with gaps. None means ``0 .. T-1``.

    Returns:
        Shape ``(..., T, D)``. Every head's queries and keys are rotated
        (adjacent pairs, as ``apply_rope``) by their token's position; the
        values are not. The causal mask follows the order of the tokens in
        ``x`` (token t sees tokens 0 .. t), whatever their positions.

    Raises:
        ValueError: if any position is ``>= max_seq_len`` (with
            ``token_positions=None``: if ``T > max_seq_len``). That is the
            reference's choice, not part of the contract: callers keep every
            position in ``[0, max_seq_len)``, and no check passes one
            outside it, so a table lookup's ``IndexError``, or rotating
            anyway, is as good.
    """
    # YOUR CODE HERE
    raise NotImplementedError
