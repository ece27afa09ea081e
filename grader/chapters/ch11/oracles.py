"""Chapter 11's oracles: the paged cache computed one token at a time, with
Python lists: a free stack popped with ``list.pop()``, each sequence's keys
gathered slot by slot through its block table, and PyTorch's
``F.scaled_dot_product_attention`` over them, as chapter 4's contiguous
cache attends.

Shapes: pages ``(N, block_size, H, d)`` (values ``d_v``); block tables
``(B, M)`` int64, padded with 0; seq_lens ``(B,)`` int64; the free list
``(F,)`` int64, the top of the stack last; q, k_new ``(B, H, d)``, v_new
``(B, H, d_v)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["allocate_blocks", "append_to_pages", "contiguous_cache", "paged_attention"]


def allocate_blocks(free_blocks, count):
    """``count`` pops of the free list as a Python list: ``(taken, left)``,
    int64 tensors."""
    stack = free_blocks.tolist()
    taken = [stack.pop() for _ in range(count)]
    return torch.tensor(taken, dtype=torch.int64), torch.tensor(stack, dtype=torch.int64)


def append_to_pages(k_pages, v_pages, block_tables, seq_lens, k_new, v_new, free_blocks):
    """One token a sequence, in batch order, a Python loop over the batch."""
    k_pages, v_pages, block_tables = k_pages.clone(), v_pages.clone(), block_tables.clone()
    block_size = k_pages.shape[1]
    stack = free_blocks.tolist()
    for b, length in enumerate(seq_lens.tolist()):
        logical, slot = divmod(length, block_size)
        if slot == 0:  # the last block is full, or there is none yet
            block_tables[b, logical] = stack.pop()
        page = int(block_tables[b, logical])
        k_pages[page, slot] = k_new[b]
        v_pages[page, slot] = v_new[b]
    return k_pages, v_pages, block_tables, seq_lens + 1, torch.tensor(stack, dtype=torch.int64)


def contiguous_cache(pages, block_tables, seq_lens):
    """Each sequence's cached vectors in token order, ``[(H, T_b, d), ...]``,
    read slot by slot: chapter 4's cache for that sequence."""
    block_size = pages.shape[1]
    caches = []
    for b, length in enumerate(seq_lens.tolist()):
        tokens = [pages[int(block_tables[b, t // block_size]), t % block_size] for t in range(length)]
        caches.append(torch.stack(tokens, dim=1))  # (H, T_b, d)
    return caches


def paged_attention(q, k_pages, v_pages, block_tables, seq_lens):
    """Each sequence's query over its keys gathered in token order, by
    ``F.scaled_dot_product_attention``: ``(B, H, d_v)``."""
    keys = contiguous_cache(k_pages, block_tables, seq_lens)
    values = contiguous_cache(v_pages, block_tables, seq_lens)
    outputs = [F.scaled_dot_product_attention(q[b][:, None, :], k, v)[:, 0]  # (H, d_v)
               for b, (k, v) in enumerate(zip(keys, values))]
    return torch.stack(outputs)  # (B, H, d_v)
