"""Chapter 6: grouped-query and multi-query attention.

Fill in the body of each function and method (the lines that raise
NotImplementedError). Read chapters/06_grouped_query_attention/README.md
first; grade your work with

    mha-course grade ch06

Conventions used in every exercise of this chapter:

* Queries have ``H_q`` heads; keys and values have ``H_kv`` heads, and
  ``H_q`` is a multiple of ``H_kv``. Each K/V head serves a group of
  ``group = H_q // H_kv`` consecutive query heads: query head ``h`` uses K/V
  head ``h // group``. ``H_kv == H_q`` is multi-head attention (groups of
  one); ``H_kv == 1`` is multi-query attention (one group of every head).
* Heads as in chapter 3: split tensors are ``(B, H, T, d)``, head ``h``
  owning features ``h * d`` to ``(h + 1) * d`` of a projection's output;
  weights in ``nn.Linear`` layout ``(d_out, d_in)``.
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
* Gradients: ``grouped_query_attention`` (in float64, with respect to q, k
  and v) and ``GroupedQueryAttention`` (with respect to ``x``) are
  differentiated by autograd; keep them in the graph.
* Devices: inputs come on the CPU or on a GPU; make any new tensor on the
  inputs' device (``device=x.device``) and return results there.

You may call ``torch.softmax``, ``repeat_interleave`` and
``F.scaled_dot_product_attention``, but not ``nn.MultiheadAttention`` or
``F.multi_head_attention_forward``. ``grouped_query_attention`` returns the
weights of every query head, which ``F.scaled_dot_product_attention`` does
not give: the grouping there is yours to write (lesson, section 4).
"""

import math

import torch
from torch import nn


def expand_kv_heads(kv: torch.Tensor, num_query_heads: int) -> torch.Tensor:
    """Give every query head its K/V head: each K/V head repeated for its group.

    Dtypes: float32 or float64; the result has ``kv``'s dtype (its entries
    are ``kv``'s, repeated).

    Args:
        kv: keys or values, shape ``(B, H_kv, S, d)``.
        num_query_heads: ``H_q``, a multiple of ``H_kv``.

    Returns:
        Shape ``(B, H_q, S, d)``: ``result[:, h]`` is ``kv[:, h // group]``
        with ``group = H_q // H_kv``. For ``H_kv = 2`` and ``H_q = 4`` the
        result holds K/V heads ``0, 0, 1, 1``, not ``0, 1, 0, 1``.

    Raises:
        ValueError: when ``H_q`` is not a multiple of ``H_kv``.
    """
    # BEGIN SOLUTION
    num_kv_heads = kv.shape[1]
    if num_query_heads % num_kv_heads:
        raise ValueError(f"{num_query_heads} query heads do not split into {num_kv_heads} equal groups")
    group = num_query_heads // num_kv_heads
    # repeat_interleave copies each head in place, (0, 0, 1, 1); repeat would
    # tile the whole stack, (0, 1, 0, 1), and pair query heads with the wrong keys.
    return kv.repeat_interleave(group, dim=1)  # (B, H_q, S, d)
    # END SOLUTION


def grouped_query_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention where groups of query heads share a K/V head.

    Dtypes: ``q``, ``k``, ``v`` float32 or float64, one dtype, and a bool
    ``mask``; both results have ``q``'s dtype (the course's precision rule).

    Args:
        q: queries, shape ``(B, H_q, L, d)``.
        k: keys, shape ``(B, H_kv, S, d)``, ``H_q`` a multiple of ``H_kv``.
        v: values, shape ``(B, H_kv, S, d_v)``.
        mask: optional bool, broadcastable to ``(B, H_q, L, S)``, the shape
            of the scores (one matrix per QUERY head): ``(L, S)`` for every
            head and sequence alike, ``(B, 1, L, S)`` per sequence,
            ``(B, 1, 1, S)`` for padded keys, ``(B, H_q, L, S)`` per query
            head (heads of one group may differ).

    Returns:
        ``(output, weights)`` of shapes ``(B, H_q, L, d_v)`` and
        ``(B, H_q, L, S)``: query head ``h`` attends to the keys and values
        of K/V head ``h // (H_q // H_kv)``, with the scale ``1 / sqrt(d)``.
        A query whose keys are all masked gets zero weights and a zero
        output, not NaN.
    """
    # BEGIN SOLUTION
    num_query_heads = q.shape[1]
    k = expand_kv_heads(k, num_query_heads)  # (B, H_q, S, d)
    v = expand_kv_heads(v, num_query_heads)  # (B, H_q, S, d_v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H_q, L, S)
    if mask is not None:
        # Once K/V are expanded, the scores have a row per query head: the
        # mask broadcasts against them exactly as in multi-head attention.
        scores = scores.masked_fill(~mask, float("-inf"))
    no_keys = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (B, H_q, L, 1)
    weights = torch.softmax(scores.masked_fill(no_keys, 0.0), dim=-1).masked_fill(no_keys, 0.0)
    return weights @ v, weights  # (B, H_q, L, d_v), (B, H_q, L, S)
    # END SOLUTION


class GroupedQueryAttention(nn.Module):
    """Grouped-query self-attention with separate projections for q, k and v.

    The grader loads weights by name, so keep these attributes (the names
    Hugging Face's LLaMA uses, with nn.MultiheadAttention's ``out_proj``);
    ``d = d_model // num_heads``:

    * ``q_proj``: ``nn.Linear(d_model, num_heads * d, bias=bias)``.
    * ``k_proj`` and ``v_proj``: ``nn.Linear(d_model, num_kv_heads * d,
      bias=bias)``, one ``d``-wide block per K/V head.
    * ``out_proj``: ``nn.Linear(num_heads * d, d_model, bias=bias)``.

    Args:
        d_model: ``D``, divisible by ``num_heads``.
        num_heads: ``H_q``, the number of query heads.
        num_kv_heads: ``H_kv``; ``num_heads`` is a multiple of it.
        bias: whether the four projections have a bias (LLaMA's have none).

    Raises:
        ValueError: when ``d_model`` is not divisible by ``num_heads``, or
            ``num_heads`` not by ``num_kv_heads``.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        super().__init__()
        # BEGIN SOLUTION
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} does not split into {num_heads} heads")
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not split into {num_kv_heads} equal groups")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=bias)
        # Keys and values get H_kv heads only: what GQA saves, in the weights
        # and above all in the KV cache.
        self.k_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * head_dim, d_model, bias=bias)
        # END SOLUTION

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Self-attention over ``x``.

        Dtypes: ``x`` in the dtype of the module's parameters (float32 in the
        checks); the result has that dtype.

        Args:
            x: shape ``(B, T, D)``.
            mask: optional bool, broadcastable to ``(B, H_q, T, T)``:
                ``(T, T)`` for every head and sequence alike,
                ``(B, 1, T, T)`` per sequence, ``(B, H_q, T, T)`` per query
                head.

        Returns:
            Shape ``(B, T, D)``. A query whose keys are all masked gets zero
            weights, so its output is ``out_proj``'s bias (zeros without
            bias).
        """
        # BEGIN SOLUTION
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.num_heads, -1).transpose(1, 2)  # (B, H_q, T, d)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, -1).transpose(1, 2)  # (B, H_kv, T, d)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, -1).transpose(1, 2)  # (B, H_kv, T, d)
        heads, _ = grouped_query_attention(q, k, v, mask)  # (B, H_q, T, d)
        return self.out_proj(heads.transpose(1, 2).reshape(batch, length, -1))  # (B, T, H_q * d) -> (B, T, D)
        # END SOLUTION


def kv_cache_bytes(
    batch: int,
    seq_len: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> int:
    """The memory a decoder's KV cache takes, in bytes.

    Every attention layer keeps, for every sequence of the batch and every
    cached token, a key and a value for each K/V head: two vectors of
    ``head_dim`` numbers each.

    Dtypes: Python ints and a ``torch.dtype`` in, a Python ``int`` out.

    Args:
        batch: ``B``, the sequences decoded side by side.
        seq_len: ``T``, the tokens cached per sequence.
        num_layers: the model's attention layers.
        num_kv_heads: ``H_kv``, the K/V heads of one layer (not the query heads).
        head_dim: ``d``.
        dtype: the dtype of the cached numbers: ``torch.float64``,
            ``torch.float32``, ``torch.float16``, ``torch.bfloat16``,
            ``torch.int8`` for a quantized cache, ...

    Returns:
        The size in bytes, a Python ``int`` (not a float, nor a tensor).
    """
    # BEGIN SOLUTION
    per_token = 2 * num_kv_heads * head_dim  # a key and a value for every K/V head
    # itemsize is the bytes of one number (2 for bfloat16); finfo(dtype).bits
    # counts bits, and has no answer for integer dtypes.
    return batch * seq_len * num_layers * per_token * dtype.itemsize
    # END SOLUTION
