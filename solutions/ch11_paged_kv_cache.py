"""Chapter 11: a paged KV cache.

Fill in the body of each function (the lines that raise NotImplementedError).
Read chapters/11_paged_kv_cache/README.md first; grade your work with

    mha-course grade ch11

The cache of chapter 4 gave each sequence one contiguous tensor, grown by
``torch.cat`` at every step. Here, as in vLLM (Kwon et al. 2023,
"Efficient Memory Management for Large Language Model Serving with
PagedAttention"), the keys and values of every sequence of a batch live in
one pool of fixed-size blocks, and a block table says where each sequence's
tokens are.

Conventions used in every exercise of this chapter:

* Pages: ``k_pages`` ``(N, block_size, H, d)`` and ``v_pages``
  ``(N, block_size, H, d_v)`` hold ``N`` physical blocks of ``block_size``
  tokens each (the layout of vLLM's FlashAttention backend, one tensor for
  K and one for V). Slot ``s`` of block ``p`` is ``k_pages[p, s]``, the
  ``(H, d)`` key of one token.
* Block tables: ``block_tables`` ``(B, M)`` int64. Token ``t`` of sequence
  ``b`` (counting from 0) is in logical block ``t // block_size`` of that
  sequence, at slot ``t % block_size``; its physical block is
  ``block_tables[b, t // block_size]``. A sequence of ``n`` tokens owns
  its first ``ceil(n / block_size)`` entries; the entries after those are
  0 and mean nothing (vLLM pads its block tables with 0 too).
* ``seq_lens`` ``(B,)`` int64: the tokens each sequence has in the cache.
  The slots after the last token of a block, and the blocks no table
  names, hold whatever was there before (stale numbers, never zeros):
  never read them.
* The free list ``free_blocks`` ``(F,)`` int64 is a stack, as in vLLM's
  early block allocator: a block is taken from its end (``pop()``), and a
  freed block is pushed back onto its end (``append``), so the block freed
  last is the first one reused.
* Devices: every tensor comes on the CPU or on a GPU; make any new tensor
  on the inputs' device and return results there.
* Precision: ``paged_attention`` returns ``q``'s dtype (float32 or
  float64), compared at float32's tolerance.

You may call ``torch.softmax`` and ``F.scaled_dot_product_attention``, but
not ``nn.MultiheadAttention`` or ``F.multi_head_attention_forward``.
"""

import math

import torch


def allocate_blocks(free_blocks: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Take ``count`` blocks off the free stack, the top (its last entry) first.

    The result is what ``count`` calls of ``free_blocks.pop()`` would give
    on a Python list: the last entry first, then the one before it, ...
    So a block freed (pushed onto the end) just before is reused first.

    Dtypes: int64 in, int64 out.

    Args:
        free_blocks: ``(F,)`` int64, the ids of the free physical blocks;
            the top of the stack is the last entry. Not modified.
        count: how many blocks to take, from 0 to ``F``.

    Returns:
        ``(blocks, free_blocks)``: the ``(count,)`` ids taken, in the order
        they were popped, and the ``(F - count,)`` ids still free (the
        first ``F - count`` entries, in their order).

    Raises:
        RuntimeError: when ``count > F`` (out of blocks), with nothing
            taken; a ValueError, as vLLM's allocator raises, is accepted too.
    """
    # BEGIN SOLUTION
    if count > free_blocks.shape[0]:
        raise RuntimeError(f"out of KV-cache blocks: {count} needed, {free_blocks.shape[0]} free")
    keep = free_blocks.shape[0] - count  # the blocks below the top `count` stay free
    # Popped one at a time, the top of the stack comes out first: flip the top.
    return free_blocks[keep:].flip(0), free_blocks[:keep]  # (count,), (F - count,)
    # END SOLUTION


def append_to_pages(
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    free_blocks: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Write one new token's key and value for every sequence into its pages.

    The new token of sequence ``b`` is token ``seq_lens[b]``. When the last
    block of the sequence is full (``seq_lens[b] % block_size == 0``, a new
    sequence with no block included) the token opens a new block: take one
    from the free stack (``allocate_blocks``) and write its id into the
    sequence's block table. Sequences take their blocks in batch order:
    sequence 0 first, so it gets the top of the stack. Otherwise the token
    goes into the room the last block has, and no block is taken.

    No cached token moves: every slot but the new tokens' keeps its bytes,
    and every block a table names stays where it is. You may write into
    ``k_pages`` and ``v_pages`` in place (vLLM's ``reshape_and_cache`` does)
    and return them, or return written copies.

    Dtypes: pages, ``k_new`` and ``v_new`` one float dtype; tables, lengths
    and the free list int64.

    Args:
        k_pages: ``(N, block_size, H, d)``.
        v_pages: ``(N, block_size, H, d_v)``.
        block_tables: ``(B, M)`` int64; ``M`` has room for one more token
            of every sequence.
        seq_lens: ``(B,)`` int64, each from 0 up.
        k_new: ``(B, H, d)``, the new token's key for each sequence.
        v_new: ``(B, H, d_v)``, its value.
        free_blocks: ``(F,)`` int64, the free stack (top last).

    Returns:
        ``(k_pages, v_pages, block_tables, seq_lens, free_blocks)``: the
        pages with the new keys and values written, the block tables with
        the new blocks recorded, ``seq_lens + 1``, and the blocks still free.

    Raises:
        RuntimeError: when the free stack has fewer blocks than the
            sequences need (``allocate_blocks`` says so).
    """
    # BEGIN SOLUTION
    block_size = k_pages.shape[1]
    positions = seq_lens  # (B,): the new token of sequence b is token seq_lens[b]
    # A new token at slot 0 opens a block: the last one is full, or there is none.
    opening = torch.nonzero(positions % block_size == 0).flatten()  # (n,), in batch order
    blocks, free_blocks = allocate_blocks(free_blocks, opening.shape[0])
    block_tables = block_tables.clone()
    block_tables[opening, positions[opening] // block_size] = blocks.to(block_tables.device)
    rows = torch.arange(seq_lens.shape[0], device=seq_lens.device)  # (B,)
    pages = block_tables[rows, positions // block_size]  # (B,): the physical block of each new token
    slots = positions % block_size  # (B,)
    # Copies, so that the caller's tensors stay as they were; vLLM writes in place.
    k_pages, v_pages = k_pages.clone(), v_pages.clone()
    k_pages[pages, slots] = k_new  # B slots of (H, d)
    v_pages[pages, slots] = v_new  # B slots of (H, d_v)
    return k_pages, v_pages, block_tables, seq_lens + 1, free_blocks
    # END SOLUTION


def paged_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    """One decoding step of attention, each sequence over its own pages.

    Sequence ``b`` has one query (its newest token, whose key is already in
    the cache) and attends to its ``seq_lens[b]`` cached tokens, found
    through its block table: the same numbers as chapter 4's contiguous
    cache, ``softmax(q k^T / sqrt(d)) v`` over those keys, in any order of
    the physical blocks.

    Dtypes: ``q`` and the pages float32 or float64, one dtype; the result
    has ``q``'s dtype. Tables and lengths int64.

    Args:
        q: ``(B, H, d)``, one query per sequence.
        k_pages: ``(N, block_size, H, d)``.
        v_pages: ``(N, block_size, H, d_v)``.
        block_tables: ``(B, M)`` int64.
        seq_lens: ``(B,)`` int64, each from 1 to ``M * block_size``.

    Returns:
        ``(B, H, d_v)``: each sequence's attention output.
    """
    # BEGIN SOLUTION
    block_size = k_pages.shape[1]
    batch, max_blocks = block_tables.shape
    k = k_pages[block_tables]  # (B, M, block_size, H, d): each sequence's pages, in logical order
    v = v_pages[block_tables]  # (B, M, block_size, H, d_v)
    k = k.reshape(batch, max_blocks * block_size, *k.shape[-2:]).transpose(1, 2)  # (B, H, S, d), S = M * bs
    v = v.reshape(batch, max_blocks * block_size, *v.shape[-2:]).transpose(1, 2)  # (B, H, S, d_v)
    positions = torch.arange(max_blocks * block_size, device=q.device)  # (S,)
    valid = positions < seq_lens[:, None]  # (B, S): the slots that hold a token of the sequence
    scores = (k @ q[..., None]).squeeze(-1) / math.sqrt(q.shape[-1])  # (B, H, S)
    # The stale slots after the last token, and the padding of the table, are never read.
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (B, H, S); seq_lens >= 1: never a row of -inf only
    return (weights[:, :, None, :] @ v).squeeze(-2)  # (B, H, d_v)
    # END SOLUTION
