"""Chapter 11 in the style of vLLM.

The style of a student who read vLLM: the block allocator of its early
``block_manager.py`` (a Python list of free blocks, ``pop()`` to allocate,
``ValueError("Out of memory! ...")`` when empty); the scheduler's
``append_slots`` (a new block only when the last one is full) and the model
runner's ``slot_mapping`` (``block_number * block_size + block_offset``),
written by ``reshape_and_cache`` into the pages seen as one flat array of
slots; the paged attention kernel's loop over a sequence's blocks, the
context length masking the last one, its logits by ``q @ k`` times the
scale and a softmax over the whole context.
"""

import math

import torch


def allocate_blocks(free_blocks, count):
    free = free_blocks.tolist()
    if count > len(free):
        raise ValueError("Out of memory! No free blocks are available.")
    allocated = [free.pop() for _ in range(count)]
    return (torch.tensor(allocated, dtype=torch.int64, device=free_blocks.device),
            torch.tensor(free, dtype=torch.int64, device=free_blocks.device))


def _reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
    num_blocks, block_size = key_cache.shape[:2]
    key_cache.view(num_blocks * block_size, *key_cache.shape[2:])[slot_mapping] = key
    value_cache.view(num_blocks * block_size, *value_cache.shape[2:])[slot_mapping] = value


def append_to_pages(k_pages, v_pages, block_tables, seq_lens, k_new, v_new, free_blocks):
    block_size = k_pages.shape[1]
    block_tables = block_tables.clone()
    slot_mapping = []
    for seq_id, seq_len in enumerate(seq_lens.tolist()):
        if seq_len % block_size == 0:  # the last block is full: append_slots takes a new one
            new_block, free_blocks = allocate_blocks(free_blocks, 1)
            block_tables[seq_id, seq_len // block_size] = new_block[0]
        block_number = int(block_tables[seq_id, seq_len // block_size])
        block_offset = seq_len % block_size
        slot_mapping.append(block_number * block_size + block_offset)
    key_cache, value_cache = k_pages.clone(), v_pages.clone()
    _reshape_and_cache(k_new, v_new, key_cache, value_cache,
                       torch.tensor(slot_mapping, dtype=torch.long, device=k_pages.device))
    return key_cache, value_cache, block_tables, seq_lens + 1, free_blocks


def paged_attention(q, k_pages, v_pages, block_tables, seq_lens):
    block_size = k_pages.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    outputs = []
    for seq_id, context_len in enumerate(seq_lens.tolist()):
        num_blocks = (context_len + block_size - 1) // block_size
        keys, values = [], []
        for block_idx in range(num_blocks):
            physical_block_number = int(block_tables[seq_id, block_idx])
            tokens = min(block_size, context_len - block_idx * block_size)  # the last block may be partial
            keys.append(k_pages[physical_block_number, :tokens])  # (tokens, H, d)
            values.append(v_pages[physical_block_number, :tokens])
        k = torch.cat(keys).transpose(0, 1)  # (H, T, d)
        v = torch.cat(values).transpose(0, 1)  # (H, T, d_v)
        qk = (k @ q[seq_id][:, :, None]).squeeze(-1) * scale  # (H, T)
        logits = torch.softmax(qk, dim=-1)
        outputs.append((logits[:, None, :] @ v).squeeze(1))  # (H, d_v)
    return torch.stack(outputs)
