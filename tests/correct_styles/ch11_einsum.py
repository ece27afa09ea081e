"""Chapter 11 with einsum and flat indices.

The free stack as a tensor: the top ``count`` entries reversed with an index
``arange`` counting down; appending as flat slot numbers (``page * block_size
+ slot``) written with ``index_copy`` into the pages seen as ``(N * block_size,
...)``, the opening sequences found with a cumulative sum; attention by
``index_select`` on those flat slots, ``torch.einsum`` for the scores and the
output, and an additive mask of ``-inf``.
"""

import torch


def allocate_blocks(free_blocks, count):
    size = free_blocks.numel()
    if count > size:
        raise RuntimeError(f"out of blocks: asked for {count}, {size} free")
    top = torch.arange(size - 1, size - 1 - count, -1, device=free_blocks.device)
    return free_blocks.index_select(0, top), free_blocks[: size - count]


def append_to_pages(k_pages, v_pages, block_tables, seq_lens, k_new, v_new, free_blocks):
    num_blocks, block_size = k_pages.shape[:2]
    opens = seq_lens % block_size == 0
    count = int(opens.sum())
    blocks, free_blocks = allocate_blocks(free_blocks, count)
    order = torch.cumsum(opens.long(), dim=0) - 1  # the rank of each opening sequence
    logical = torch.div(seq_lens, block_size, rounding_mode="floor")
    rows = torch.arange(len(seq_lens), device=seq_lens.device)
    current = block_tables[rows, logical]
    if count:
        current = torch.where(opens, blocks[order.clamp(min=0)], current)
    tables = block_tables.clone()
    tables[rows, logical] = current
    flat = current * block_size + seq_lens % block_size
    k_flat = k_pages.reshape(num_blocks * block_size, -1).index_copy(0, flat, k_new.reshape(len(flat), -1))
    v_flat = v_pages.reshape(num_blocks * block_size, -1).index_copy(0, flat, v_new.reshape(len(flat), -1))
    return k_flat.view_as(k_pages), v_flat.view_as(v_pages), tables, seq_lens + 1, free_blocks


def paged_attention(q, k_pages, v_pages, block_tables, seq_lens):
    num_blocks, block_size, heads, dim = k_pages.shape
    batch, max_blocks = block_tables.shape
    offsets = torch.arange(block_size, device=q.device)
    flat = (block_tables[:, :, None] * block_size + offsets).reshape(batch, -1)  # (B, S)
    k = k_pages.reshape(num_blocks * block_size, heads, dim).index_select(0, flat.flatten())
    v = v_pages.reshape(num_blocks * block_size, heads, -1).index_select(0, flat.flatten())
    k, v = k.view(batch, flat.shape[1], heads, dim), v.view(batch, flat.shape[1], heads, -1)
    scores = torch.einsum("bhd,bshd->bhs", q, k) * dim ** -0.5
    position = torch.arange(max_blocks * block_size, device=q.device)
    bias = torch.zeros(batch, position.numel(), dtype=q.dtype, device=q.device)
    bias = bias.masked_fill(position[None, :] >= seq_lens[:, None], float("-inf"))
    weights = torch.softmax(scores + bias[:, None, :], dim=-1)
    return torch.einsum("bhs,bshe->bhe", weights, v)
