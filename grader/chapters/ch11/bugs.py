"""Known bugs of chapter 11: a paged KV cache.

Each is an edit of the reference solution (``old`` to ``new``) with the
hint a student reads when their answer matches it; its lesson's Pitfalls
section names it in a ``<!-- known bugs: ... -->`` tag.
"""

from grader.chapters import KnownBug

BUGS = (
    # -- allocate_blocks -------------------------------------------------------------------
    KnownBug("allocate_blocks", "takes-the-bottom",
             "looks like the blocks are taken from the front of the free list (a queue): the free "
             "list is a stack, popped from its end, so that the block freed last (pushed onto the "
             "end) is the first one reused",
             "return free_blocks[keep:].flip(0), free_blocks[:keep]",
             "return free_blocks[:count], free_blocks[count:]"),
    KnownBug("allocate_blocks", "not-flipped",
             "looks like the top blocks are returned in list order: popped one at a time, the last "
             "entry comes out first, then the one before it (flip the top count entries)",
             "return free_blocks[keep:].flip(0), free_blocks[:keep]",
             "return free_blocks[keep:], free_blocks[:keep]"),
    KnownBug("allocate_blocks", "negative-slice",
             "looks like the top is sliced as free_blocks[-count:]: with count 0 that is the whole "
             "list (-0 is 0), so taking no block takes them all; slice from len - count",
             "return free_blocks[keep:].flip(0), free_blocks[:keep]",
             "return free_blocks[-count:].flip(0), free_blocks[:-count]"),
    KnownBug("allocate_blocks", "still-free",
             "looks like the blocks taken stay on the free list: return the list without them, or "
             "the next allocation hands the same blocks to another sequence",
             "return free_blocks[keep:].flip(0), free_blocks[:keep]",
             "return free_blocks[keep:].flip(0), free_blocks"),
    KnownBug("allocate_blocks", "no-out-of-blocks-error",
             "looks like nothing is raised when fewer blocks are free than asked for: fewer blocks "
             "come back, and the sequence writes into a block it does not own; raise a "
             "RuntimeError instead",
             "    if count > free_blocks.shape[0]:\n"
             "        raise RuntimeError(f\"out of KV-cache blocks: {count} needed, {free_blocks.shape[0]} free\")\n",
             ""),
    KnownBug("allocate_blocks", "refuses-the-last-block",
             "looks like the out-of-blocks test is count >= F: taking every free block is allowed, "
             "only more than F is out of blocks",
             "if count > free_blocks.shape[0]:", "if count >= free_blocks.shape[0]:",
             error=r"raised (RuntimeError|ValueError|MemoryError)\b.*(?i:block|memory|free)"),
    # -- append_to_pages -------------------------------------------------------------------
    KnownBug("append_to_pages", "block-every-token",
             "looks like a new block is taken at every token: a sequence takes one only when its "
             "last block is full (seq_len % block_size == 0), else the token goes into the room "
             "the last block has",
             "opening = torch.nonzero(positions % block_size == 0).flatten()",
             "opening = torch.nonzero(positions >= 0).flatten()"),
    KnownBug("append_to_pages", "block-one-token-early",
             "looks like the new block is taken one token early, when the new token fills the last "
             "slot ((seq_len + 1) % block_size == 0): a block is full only once it holds "
             "block_size tokens, so the token at slot 0 opens one",
             "opening = torch.nonzero(positions % block_size == 0).flatten()",
             "opening = torch.nonzero((positions + 1) % block_size == 0).flatten()"),
    KnownBug("append_to_pages", "seq-len-counts-the-new-token",
             "looks like the new token is put at position seq_len - 1, as if seq_lens counted it "
             "already: it overwrites the last cached token; seq_lens[b] tokens are cached, at "
             "positions 0 .. seq_len - 1, so the new one is at position seq_len",
             "positions = seq_lens  #", "positions = seq_lens - 1  #"),
    KnownBug("append_to_pages", "writes-to-logical-block",
             "looks like the block table is not read: the new token goes to block seq_len // "
             "block_size of the pool, its logical block, instead of block_tables[b, seq_len // "
             "block_size], the physical block that holds it",
             "pages = block_tables[rows, positions // block_size]",
             "pages = positions // block_size"),
    KnownBug("append_to_pages", "table-not-updated",
             "looks like the new block is not written into the block table: the sequence's tokens "
             "in it can never be found (and the token went to whatever the table's entry named); "
             "record block_tables[b, seq_len // block_size] = the block taken",
             "    block_tables[opening, positions[opening] // block_size] = blocks.to(block_tables.device)\n",
             ""),
    KnownBug("append_to_pages", "lengths-not-advanced",
             "looks like seq_lens is returned unchanged: each sequence has one more token now "
             "(seq_lens + 1), or the next append overwrites this one",
             "return k_pages, v_pages, block_tables, seq_lens + 1, free_blocks",
             "return k_pages, v_pages, block_tables, seq_lens, free_blocks"),
    KnownBug("append_to_pages", "free-list-not-shrunk",
             "looks like the free list is returned as it came in: the blocks taken are still on it, "
             "and the next append hands them out again; return the list allocate_blocks left",
             "blocks, free_blocks = allocate_blocks(free_blocks, opening.shape[0])",
             "blocks, _ = allocate_blocks(free_blocks, opening.shape[0])"),
    # -- paged_attention -------------------------------------------------------------------
    KnownBug("paged_attention", "no-length-mask",
             "looks like every slot of every page in the block table is attended to: the slots "
             "after a sequence's last token (the rest of its last block, the table's padding) hold "
             "stale numbers; mask the positions >= seq_lens[b]",
             'scores = scores.masked_fill(~valid[:, None, :], float("-inf"))',
             "scores = scores"),
    KnownBug("paged_attention", "mask-one-past",
             "looks like the mask keeps one slot too many (positions <= seq_len): token seq_len "
             "is not in the cache, its slot is stale; keep positions < seq_len",
             "valid = positions < seq_lens[:, None]", "valid = positions <= seq_lens[:, None]"),
    KnownBug("paged_attention", "longest-length",
             "looks like every sequence is read up to the longest one's length: a ragged batch "
             "masks each sequence at its own seq_lens[b]",
             "valid = positions < seq_lens[:, None]",
             "valid = (positions < seq_lens.max()).expand(batch, -1)"),
    KnownBug("paged_attention", "physical-is-logical",
             "looks like the block table is not read: each sequence's logical block j is taken "
             "from physical block j of the pool; gather k_pages[block_tables[b, j]]",
             "k = k_pages[block_tables]  # (B, M, block_size, H, d): each sequence's pages, in logical order\n"
             "    v = v_pages[block_tables]  # (B, M, block_size, H, d_v)",
             "logical = torch.arange(max_blocks, device=q.device).expand(batch, -1)\n"
             "    k = k_pages[logical]\n"
             "    v = v_pages[logical]"),
    KnownBug("paged_attention", "heads-not-moved",
             "looks like the gathered pages are viewed as (B, H, S, d) without moving the head "
             "axis: they are (B, M, block_size, H, d), tokens before heads; reshape to (B, S, H, d) "
             "and then transpose(1, 2)",
             "k = k.reshape(batch, max_blocks * block_size, *k.shape[-2:]).transpose(1, 2)  # (B, H, S, d), S = M * bs\n"
             "    v = v.reshape(batch, max_blocks * block_size, *v.shape[-2:]).transpose(1, 2)",
             "k = k.reshape(batch, k.shape[-2], max_blocks * block_size, k.shape[-1])\n"
             "    v = v.reshape(batch, v.shape[-2], max_blocks * block_size, v.shape[-1])"),
    KnownBug("paged_attention", "no-scale",
             "looks like the scores are not divided by sqrt(d): softmax(q k^T / sqrt(d)) v, as in "
             "every chapter",
             "(k @ q[..., None]).squeeze(-1) / math.sqrt(q.shape[-1])",
             "(k @ q[..., None]).squeeze(-1)"),
)
