"""Chapter 10: bounded-memory decoding: sliding windows, a rolling cache,
attention sinks.

Fill in the body of each function (the lines that raise NotImplementedError).
Read chapters/10_streaming_decoding/README.md first; grade your work with

    mha-course grade ch10

Conventions used in every exercise of this chapter:

* A boolean mask is True where a query MAY attend to a key, and queries are
  aligned bottom-right, as in chapter 4: with ``L`` queries and ``S`` keys,
  query ``i`` is the token at position ``p = i + S - L``.
* A window of ``W`` means ``W`` keys, the query's own included: token ``p``
  sees the keys ``p - W + 1 .. p`` (Hugging Face's ``sliding_window``,
  ``kv_idx > q_idx - W``; a rolling buffer of ``W`` slots holds exactly
  those). ``W = 1`` is a token that sees itself alone.
* Attention sinks (StreamingLLM): the first ``sinks`` tokens of the text
  stay visible to every later token, whatever the window.
* The rolling cache is a buffer of ``C = sinks + W`` slots along the token
  axis, ``(B, H, C, d)``, that never grows: token ``t`` goes to slot ``t``
  while ``t < sinks`` (a sink, kept forever), else to slot
  ``sinks + (t - sinks) % W``, the ring after the sinks, where it takes the
  place of the oldest token there (Mistral 7B's ``i mod W`` when
  ``sinks = 0``). Slots not yet written hold anything (zeros at first).
* The cache holds keys as projected, NOT rotated: at each step the keys
  are rotated (RoPE, adjacent pairs as chapter 5's ``apply_rope``) by their
  position WITHIN THE CACHE, as StreamingLLM does: the ``n`` tokens the
  cache holds, taken in the order of the text, are at positions
  ``0 .. n - 1``, the newest token (the query) at ``n - 1``.
* Heads as in chapter 3: ``H`` heads of ``d = D // H`` features; weights in
  ``nn.Linear`` layout ``(d_out, d_in)``.
* Precision, the course's rule: a function returns floating results in the
  dtype of its floating inputs; float32 and float64 inputs are compared at
  float32's tolerance. RoPE's angles are computed in float32.
* Devices: inputs come on the CPU or on a GPU; make any new tensor on the
  inputs' device and return results there.
* Bounded memory: no step may build anything whose size grows with the
  number of tokens decoded so far (``count``): only with the cache's size.

You may call ``torch.softmax`` and ``F.scaled_dot_product_attention``, but
not ``nn.MultiheadAttention`` or ``F.multi_head_attention_forward``.
"""

import math

import torch


def sliding_window_mask(
    query_len: int,
    key_len: int,
    window: int,
    sinks: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The causal sliding-window mask with attention sinks, aligned bottom-right.

    Dtypes: the result is bool.

    Args:
        query_len: ``L``, at least 1.
        key_len: ``S``, at least 1, smaller or larger than ``L``.
        window: ``W``, at least 1: how many keys a query sees, its own
            included (before the sinks are added).
        sinks: how many first tokens (keys ``0 .. sinks - 1``) every later
            query sees as well; 0 for a plain sliding window.
        device: where to create the mask; ``None`` means the default device.

    Returns:
        A bool tensor of shape ``(L, S)`` on ``device``: query ``i``, at
        position ``p = i + S - L``, may attend to key ``j`` when
        ``j <= p`` and (``j > p - W`` or ``j < sinks``). A sink is never
        seen by a query before it: the mask stays causal.
    """
    # BEGIN SOLUTION
    positions = torch.arange(query_len, device=device)[:, None] + (key_len - query_len)  # (L, 1)
    keys = torch.arange(key_len, device=device)[None, :]  # (1, S)
    causal = keys <= positions
    recent = keys > positions - window  # the last W tokens, the query's own included
    sink = keys < sinks  # (1, S)
    return causal & (recent | sink)  # (L, S)
    # END SOLUTION


def rolling_cache_append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    count: int,
    sinks: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write token ``count``'s key and value into a rolling buffer.

    Dtypes: the caches and the new key and value float32 or float64, one
    dtype; the results have it.

    Args:
        k_cache: ``(B, H, C, d)``, the key buffer of ``C`` slots.
        v_cache: ``(B, H, C, d_v)``, the value buffer.
        k_new: ``(B, H, 1, d)``, the new token's key.
        v_new: ``(B, H, 1, d_v)``, its value.
        count: how many tokens were appended before (0 for the first):
            the new token is token ``count`` of the text. Any size, even
            in the billions.
        sinks: how many first tokens stay in the buffer forever,
            ``0 <= sinks < C``.

    Returns:
        ``(k_cache, v_cache)``, the buffers with the new token written at
        its slot: ``count`` if ``count < sinks``, else
        ``sinks + (count - sinks) % (C - sinks)`` (while ``count < C`` that
        is slot ``count``: the buffer fills in order). Every other slot is
        unchanged and the shapes are the same: the buffer never grows.
        The buffers passed in are not modified (not in place either).
    """
    # BEGIN SOLUTION
    capacity = k_cache.shape[-2]  # C
    slot = count if count < sinks else sinks + (count - sinks) % (capacity - sinks)
    k_cache, v_cache = k_cache.clone(), v_cache.clone()  # the caller's buffers stay as they are
    k_cache[:, :, slot] = k_new[:, :, 0]  # (B, H, d) into slot `slot`
    v_cache[:, :, slot] = v_new[:, :, 0]
    return k_cache, v_cache
    # END SOLUTION


def streaming_attention_step(
    x_new: torch.Tensor,
    num_heads: int,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    count: int,
    sinks: int = 0,
    theta: float | None = 10000.0,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One step of streaming decoding: append, rotate within the cache, attend.

    The new token is token ``count`` of the text. Its key and value go into
    the rolling buffer as ``rolling_cache_append`` puts them (unrotated);
    then it attends to every token the buffer holds, itself included, and
    to nothing else (not to a slot not yet written). With RoPE, the held
    tokens, taken in the order of the text, are rotated by their positions
    within the cache, ``0 .. n - 1``, the new token (the query) by
    ``n - 1``: StreamingLLM's positions, never the text's.

    Decoding a text one token at a time this way gives, without RoPE, the
    rows of attention over the whole text under
    ``sliding_window_mask(T, T, C - sinks, sinks)``.

    Dtypes: ``x_new``, the weights and the caches float32 or float64, one
    dtype; the results have it.

    Args:
        x_new: ``(B, 1, d_model)``, the new token.
        num_heads: ``H``.
        w_q, w_k: ``(D, d_model)``; ``d = D // H`` is even when ``theta``
            is not None.
        w_v: ``(D_v, d_model)``.
        w_o: ``(d_out, D_v)``.
        k_cache: ``(B, H, C, d)``, the unrotated keys of the held tokens.
        v_cache: ``(B, H, C, D_v // H)``.
        count: how many tokens came before (any size).
        sinks: as ``rolling_cache_append``; the window is ``C - sinks``.
        theta: RoPE's base (adjacent pairs, angles in float32), or None
            for no position embedding.

    Returns:
        ``(output, (k_cache, v_cache))``: the new token's output
        ``(B, 1, d_out)`` and the buffers after the append, of the same
        shapes as those passed in (which are not modified).
    """
    # BEGIN SOLUTION
    batch = x_new.shape[0]
    q, k, v = (x_new @ w.T for w in (w_q, w_k, w_v))  # (B, 1, D), (B, 1, D), (B, 1, D_v)
    q, k, v = (t.view(batch, 1, num_heads, -1).transpose(1, 2) for t in (q, k, v))  # (B, H, 1, ·)
    capacity, head_dim = k_cache.shape[-2], k_cache.shape[-1]  # C, d
    slot = torch.arange(capacity, device=x_new.device)  # (C,)
    # The text position of the token in each ring slot after this step: the
    # latest t <= count written there. Before the buffer is full, slot s holds token s.
    token = torch.where(slot < sinks, slot, count - (count - slot) % (capacity - sinks))  # (C,)
    held = slot <= count  # (C,): the slots written so far, this step's included
    evicted = max(count + 1 - capacity, 0)  # tokens dropped from the ring so far
    # StreamingLLM: positions within the cache, sinks 0 .. sinks - 1, then
    # the ring's tokens in text order; the newest, the query, at n - 1.
    positions = torch.where(slot < sinks, slot, token - evicted)  # (C,)
    query_at = torch.tensor([count - evicted], device=x_new.device)  # (1,)

    def rotate(t, at):  # (B, H, n, d) turned by the positions at (n,): adjacent pairs, as chapter 5
        if theta is None:
            return t
        frequencies = theta ** (-torch.arange(0, head_dim, 2, device=t.device) / head_dim)  # (d/2,)
        angles = at[:, None].float() * frequencies.float()  # (n, d/2), float32 as chapter 5
        cos, sin = angles.cos().to(t.dtype), angles.sin().to(t.dtype)
        even, odd = t.unflatten(-1, (-1, 2)).unbind(-1)  # (B, H, n, d/2) each
        turned = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)  # (B, H, n, d/2, 2)
        return turned.flatten(-2)  # (B, H, n, d): the pairs side by side again

    k_cache, v_cache = rolling_cache_append(k_cache, v_cache, k, v, count, sinks)  # unrotated keys
    keys, q = rotate(k_cache, positions), rotate(q, query_at)  # rotated copies, at cache positions
    scores = q @ keys.transpose(-2, -1) / math.sqrt(head_dim)  # (B, H, 1, C)
    weights = torch.softmax(scores.masked_fill(~held, float("-inf")), dim=-1)  # never an empty row
    heads = (weights @ v_cache).transpose(1, 2).reshape(batch, 1, -1)  # (B, 1, D_v)
    return heads @ w_o.T, (k_cache, v_cache)  # (B, 1, d_out)
    # END SOLUTION
