"""Chapter 11 in plain Python loops, attention block by block.

The allocator pops a list one block at a time; appending walks the batch and
writes one slot a sequence; attention reads one block at a time and keeps a
running maximum, sum and output (the online softmax of chapter 7, as
FlashDecoding and vLLM's second paged-attention kernel split a long
context), in float64 inside.
"""

import math

import torch


def allocate_blocks(free_blocks, count):
    stack = [int(block) for block in free_blocks]
    if len(stack) < count:
        raise RuntimeError("no free KV-cache block left")
    taken = []
    for _ in range(count):
        taken.append(stack.pop())
    as_tensor = lambda ids: torch.tensor(ids, dtype=free_blocks.dtype, device=free_blocks.device)  # noqa: E731
    return as_tensor(taken), as_tensor(stack)


def append_to_pages(k_pages, v_pages, block_tables, seq_lens, k_new, v_new, free_blocks):
    block_size = k_pages.shape[1]
    k_pages, v_pages, block_tables = k_pages.clone(), v_pages.clone(), block_tables.clone()
    for b in range(len(seq_lens)):
        position = int(seq_lens[b])
        logical, slot = position // block_size, position % block_size
        if slot == 0:
            (block,), free_blocks = allocate_blocks(free_blocks, 1)
            block_tables[b, logical] = block
        page = int(block_tables[b, logical])
        k_pages[page, slot] = k_new[b]
        v_pages[page, slot] = v_new[b]
    return k_pages, v_pages, block_tables, seq_lens + 1, free_blocks


def paged_attention(q, k_pages, v_pages, block_tables, seq_lens):
    block_size = k_pages.shape[1]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.zeros(q.shape[0], q.shape[1], v_pages.shape[-1], dtype=torch.float64, device=q.device)
    for b in range(q.shape[0]):
        length = int(seq_lens[b])
        running_max = torch.full((q.shape[1],), float("-inf"), dtype=torch.float64, device=q.device)
        running_sum = torch.zeros(q.shape[1], dtype=torch.float64, device=q.device)
        acc = torch.zeros(q.shape[1], v_pages.shape[-1], dtype=torch.float64, device=q.device)
        for start in range(0, length, block_size):
            page = int(block_tables[b, start // block_size])
            used = min(block_size, length - start)
            k = k_pages[page, :used].double()  # (used, H, d)
            v = v_pages[page, :used].double()
            s = torch.einsum("hd,thd->ht", q[b].double(), k) * scale  # (H, used)
            new_max = torch.maximum(running_max, s.max(dim=-1).values)
            p = torch.exp(s - new_max[:, None])
            correction = torch.exp(running_max - new_max)
            running_sum = running_sum * correction + p.sum(dim=-1)
            acc = acc * correction[:, None] + torch.einsum("ht,the->he", p, v)
            running_max = new_max
        out[b] = acc / running_sum[:, None]
    return out.to(q.dtype)
