"""Chapter 12: multi-head latent attention (MLA), DeepSeek-V2's attention.

Fill in the body of each function and class (the lines that raise
NotImplementedError). Read chapters/12_latent_attention/README.md first;
grade your work with

    mha-course grade ch12

Conventions used in every exercise of this chapter (the notation of
DeepSeek-AI, "DeepSeek-V2", 2024, section 2.1):

* A token's input ``h`` has ``D`` features. Keys and values come from one
  latent vector ``c_KV = W_DKV h`` of ``d_c`` features (``kv_rank``), the
  only part of them a decoder caches; queries from their own latent
  ``c_Q = W_DQ h`` of ``d_c'`` features (``q_rank``).
* ``H`` heads. Head ``h`` has a content query and key of ``d_h`` features
  (``head_dim``), ``q_C = W_UQ c_Q`` and ``k_C = W_UK c_KV``, a value of
  ``d_h`` features, ``v = W_UV c_KV``, and a rope query of ``d_R``
  features (``rope_dim``), ``q_R = RoPE(W_QR c_Q)``. The rope key
  ``k_R = RoPE(W_KR h)`` is ONE vector of ``d_R`` features per token,
  shared by every head. Head ``h`` attends with ``q = [q_C; q_R]`` and
  ``k = [k_C; k_R]``, the scale ``1 / sqrt(d_h + d_R)``, causally.
* Heads as in chapter 3: head ``h`` owns features ``h * d_h`` to
  ``(h + 1) * d_h`` of an up-projection's output (``h * d_R`` to
  ``(h + 1) * d_R`` of ``W_QR``'s); weights in ``nn.Linear`` layout
  ``(d_out, d_in)``, no biases (DeepSeek's have none).
* RoPE is chapter 5's ``apply_rope``, given below: adjacent pairs
  ``(2k, 2k + 1)``, ``theta = 10000``, the angles in float32. It is the
  convention of DeepSeek's own inference code (complex numbers, as Meta's
  llama); Hugging Face's port reorders the rope features and rotates
  halves, which gives the same scores (chapter 5). Only the rope parts are
  rotated; the token at index ``t`` of a sequence is at position ``t``.
* Precision, the course's rule: a function returns floating results in the
  dtype of its floating inputs (here the module's parameters, float32).
  float32 and float64 get float32's accuracy.
* Devices: inputs come on the CPU or on a GPU; make any new tensor (a mask,
  positions) on the inputs' device (``device=x.device``).

You may call ``torch.softmax`` and ``F.scaled_dot_product_attention`` (mind
its default scale), but not ``nn.MultiheadAttention`` or
``F.multi_head_attention_forward``.
"""

import math

import torch
from torch import nn

ROPE_THETA = 10000.0


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = ROPE_THETA) -> torch.Tensor:
    """Chapter 5's rotation, given: turn each pair ``(x[2k], x[2k + 1])`` of
    the last axis by the angle ``position * theta ** (-2k / d)``.

    Args:
        x: shape ``(..., T, d)``, ``d`` even, float.
        positions: int64, shape ``(T,)``: each token's position.
        theta: the base of the frequencies.

    Returns:
        Shape and dtype of ``x``.
    """
    width = x.shape[-1]
    frequencies = theta ** (-torch.arange(0, width, 2, device=x.device, dtype=torch.float32) / width)  # (d/2,)
    angles = positions.to(torch.float32)[:, None] * frequencies  # (T, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)  # (..., T, d/2) each
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)  # (..., T, d)


class MultiHeadLatentAttention(nn.Module):
    """Causal multi-head latent attention, in its naive form: every head's
    keys and values are up-projected from the latent, then attended.

    The grader loads weights by name, so keep these attributes, each an
    ``nn.Linear`` without bias (the paper's matrix after the arrow):

    * ``q_down``: ``D -> q_rank`` (``W_DQ``), the query latent ``c_Q``.
    * ``q_up``: ``q_rank -> H * head_dim`` (``W_UQ``), the content queries.
    * ``q_rope``: ``q_rank -> H * rope_dim`` (``W_QR``), the rope queries,
      one per head.
    * ``kv_down``: ``D -> kv_rank`` (``W_DKV``), the latent ``c_KV``.
    * ``k_up``: ``kv_rank -> H * head_dim`` (``W_UK``), the content keys.
    * ``v_up``: ``kv_rank -> H * head_dim`` (``W_UV``), the values.
    * ``k_rope``: ``D -> rope_dim`` (``W_KR``), the rope key: one for all
      heads, from the token's input (not from the latent).
    * ``out_proj``: ``H * head_dim -> D`` (``W_O``).

    Args:
        d_model: ``D``.
        num_heads: ``H``.
        head_dim: ``d_h``, the width of a head's content query, key and value
            (need not be ``D / H``).
        rope_dim: ``d_R``, even.
        kv_rank: ``d_c``.
        q_rank: ``d_c'``.

    ``forward(x)``: ``x`` of shape ``(B, T, D)``, the tokens at positions
    ``0 .. T - 1``; token ``t`` attends to tokens ``0 .. t``. Gives shape
    ``(B, T, D)``.

    Dtypes: ``x`` in the parameters' dtype (float32); the result has it too.
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int, rope_dim: int, kv_rank: int, q_rank: int):
        super().__init__()
        # YOUR CODE HERE
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # YOUR CODE HERE
        raise NotImplementedError


def absorbed_decode(
    module: MultiHeadLatentAttention,
    x: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One decoding step of ``module`` that attends over the latent cache
    directly, with ``W_UK`` absorbed into the query and ``W_UV`` into the
    output: no cached token's key or value is ever up-projected.

    For each head ``h`` (``W_UK_h``, ``W_UV_h``: rows ``h * d_h`` to
    ``(h + 1) * d_h`` of ``k_up.weight`` and ``v_up.weight``, each
    ``(d_h, d_c)``): the content score ``q_C . (W_UK_h c)`` is
    ``(W_UK_h^T q_C) . c``, so the query becomes a ``d_c``-wide latent query
    scored against the cached latents ``c``; the rope query is scored
    against the cached rope keys; the scale stays ``1 / sqrt(d_h + d_R)``.
    The weighted sum of latents, ``sum_t w_t c_t`` (``d_c``), times
    ``W_UV_h^T`` gives the head's output, and ``out_proj`` the result.

    The new token's position is ``T_past``, the cache's length: its rope
    query and rope key are rotated there. Reads ``module``'s parameters by
    the names of ``MultiHeadLatentAttention``'s docstring (and nothing else
    of it: ``H`` is ``q_rope``'s rows over ``k_rope``'s).

    Args:
        module: a ``MultiHeadLatentAttention`` holding the weights.
        x: the new token's input, shape ``(B, 1, D)``.
        cache: None (no earlier token, ``T_past = 0``) or
            ``(latent, rope_keys)``: the earlier tokens' ``c_KV``, shape
            ``(B, T_past, d_c)``, and their rope keys already rotated at
            their positions, shape ``(B, T_past, d_R)``.

    Returns:
        ``(output, (latent, rope_keys))``: the new token's output
        ``(B, 1, D)``, equal to the last row of ``module(x_all)`` on all
        ``T_past + 1`` tokens, and the cache with the new token's latent and
        rotated rope key appended, ``(B, T_past + 1, d_c)`` and
        ``(B, T_past + 1, d_R)``, the earlier tokens first. The cache passed
        in is not modified.

    Dtypes: ``x`` and the cache in the parameters' dtype (float32); the
    results have it too.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def latent_cache_bytes(
    batch: int,
    seq_len: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    kv_rank: int,
    rope_dim: int,
    dtype: torch.dtype,
) -> int:
    """The memory an MLA decoder's cache takes, in bytes.

    Every attention layer keeps, for every sequence of the batch and every
    cached token, what ``absorbed_decode`` caches: the latent ``c_KV`` and
    the one rope key. The model is described whole, as chapter 6's
    ``kv_cache_bytes`` takes a model: not every argument need count.

    Dtypes: Python ints and a ``torch.dtype`` in, a Python ``int`` out.

    Args:
        batch: ``B``, the sequences decoded side by side.
        seq_len: ``T``, the tokens cached per sequence.
        num_layers: the model's attention layers.
        num_heads: ``H``, the attention heads of a layer.
        head_dim: ``d_h``, a head's content width.
        kv_rank: ``d_c``, the latent's width.
        rope_dim: ``d_R``, the rope key's width.
        dtype: the dtype of the cached numbers (``torch.bfloat16``,
            ``torch.float32``, ``torch.int8``, ...).

    Returns:
        The size in bytes, a Python ``int``.
    """
    # YOUR CODE HERE
    raise NotImplementedError
