"""Chapter 4: causal attention and the KV cache.

Fill in the body of each function (the lines that raise NotImplementedError).
Read chapters/04_causal_attention/README.md first; grade your work with

    mha-course grade ch04

Conventions used in every exercise of this chapter:

* A boolean mask is True where a query MAY attend to a key. Causal means a
  token attends to itself and to earlier tokens, never to later ones.
* With ``L`` queries and ``S >= L`` keys, the queries are the LAST ``L`` of
  the ``S`` tokens (the newest ones, as when decoding with a cache): query
  ``i`` sits at position ``i + S - L`` and sees keys ``0 .. i + S - L``.
  The same rule holds for ``S < L``: the first ``L - S`` queries see no key.
  This is "bottom-right" alignment; ``is_causal=True`` in
  ``F.scaled_dot_product_attention`` is top-left and is wrong here.
* Heads as in chapter 3: ``H`` heads of ``d = D // H`` features, head ``h``
  owning features ``h * d`` to ``(h + 1) * d``; weights in ``nn.Linear``
  layout ``(d_out, d_in)``.
* A query whose keys are all masked gets zero weights and a zero output.
* Precision, the course's rule: a function returns floating results in the
  dtype of its floating inputs. float32 and float64 inputs get float32's
  accuracy: inside, a function may compute in float32 or wider (computing
  float64 inputs in float32, as llama's ``.float()`` does, is allowed), and
  the checks compare float64 results at float32's tolerance. float16 and
  bfloat16 results are compared at those dtypes' looser tolerance (the float32
  answer cast down); computing them in float32 inside is good practice. Each
  docstring's "Dtypes:" line says which dtypes the function is given.
* Gradients: ``causal_self_attention`` is differentiated by autograd (in
  float64) with respect to ``x`` and the four weights; keep them in the graph.
* Devices: inputs come on the CPU or on a GPU; make any new tensor (a mask)
  on the inputs' device (``device=x.device``) and return results there.

You may call ``torch.softmax`` and ``F.scaled_dot_product_attention``, but
not ``nn.MultiheadAttention`` or ``F.multi_head_attention_forward``.
"""

import math

import torch


def causal_mask(
    num_queries: int,
    num_keys: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The causal mask, aligned bottom-right.

    Dtypes: the result is bool.

    Args:
        num_queries: ``L``, at least 1.
        num_keys: ``S``, at least 1, smaller or larger than ``L``;
            ``None`` means ``S = L``.
        device: where to create the mask (the device of the scores it will
            mask); ``None`` means the default device.

    Returns:
        A bool tensor of shape ``(L, S)`` on ``device``, True where
        ``j <= i + S - L``. With ``S = L`` that is the lower triangle,
        diagonal included: every token sees itself. With ``S < L`` the
        first ``L - S`` rows are all False (those queries see no key).
    """
    # YOUR CODE HERE
    raise NotImplementedError


def causal_self_attention(
    x: torch.Tensor,
    num_heads: int,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal multi-head self-attention, with optional padding.

    Dtypes: ``x`` and the weights float32, float64, float16 or bfloat16, one
    dtype; ``lengths`` int64; the result has ``x``'s dtype (the course's
    precision rule).

    Args:
        x: shape ``(B, T, d_model)``.
        num_heads: ``H``.
        w_q, w_k: shape ``(D, d_model)``.
        w_v: shape ``(D_v, d_model)``.
        w_o: shape ``(d_out, D_v)``.
        lengths: optional int64 ``(B,)``: the real length of each sequence,
            from 0 to ``T``, padded at the end. Padding positions are never
            attended to (as keys). As queries they still get an output, from
            the real tokens (zeros when a sequence has none); a model ignores
            those rows, but they are checked too.

    Returns:
        Shape ``(B, T, d_out)``, in the dtype of ``x``. Output ``t`` depends
        on tokens ``0 .. t`` only.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def attend_with_cache(
    x_new: torch.Tensor,
    num_heads: int,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One step of causal multi-head self-attention with a KV cache.

    The new tokens come after every cached one. Feeding a sequence in
    chunks, a step at a time, must give the rows ``causal_self_attention``
    gives for the whole sequence at once.

    Dtypes: ``x_new``, the weights and the cache float32, one dtype; the
    output and the returned cache have ``x_new``'s dtype (the course's
    precision rule).

    Args:
        x_new: the newest tokens, shape ``(B, T_new, d_model)``: one token
            when generating, several when a prompt is fed in chunks.
        num_heads: ``H``.
        w_q, w_k, w_v, w_o: as in ``causal_self_attention``.
        cache: None (or left out) before the first step, else
            ``(k_cache, v_cache)``: the keys and values of every earlier
            token, already split into heads, shapes ``(B, H, T_past, D // H)``
            and ``(B, H, T_past, D_v // H)``.

    Returns:
        ``(output, (k, v))``: the new tokens' output ``(B, T_new, d_out)``
        and, as a tuple, the cache with their keys and values appended along
        the token axis, ``(B, H, T_past + T_new, ·)``: the cached tokens
        first. The cache passed in is not modified (not in place either).
    """
    # YOUR CODE HERE
    raise NotImplementedError
