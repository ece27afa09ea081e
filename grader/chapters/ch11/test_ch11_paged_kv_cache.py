"""Hidden checks for chapter 11: a paged KV cache.

Every exercise is checked against an oracle computed one token at a time
with Python lists (a stack popped with ``list.pop()``, each sequence's keys
read slot by slot through its block table, PyTorch's attention over them),
against the reference, and against properties a paged cache must have: the
block freed last is reused first; out of blocks is an error; appending
moves no cached token and takes a block only when the last is full;
attention reads no stale slot and does not care where the blocks are.

The caches are ragged: lengths that are not multiples of the block size, a
new sequence with no block, a block size of 1, physical blocks in shuffled
order, and stale random numbers in every slot no token holds, so that
reading one changes the answer.
"""

import pytest
import torch

from grader.checks import Oracles, case_ids, exercise, expect_raises, portability_check, portable, run
from grader.compare import expect_close, expect_like, fail, matching_hint, unpack

oracles = Oracles("ch11")

OUT_OF_BLOCKS = ("RuntimeError", "ValueError")
APPENDED = ("k_pages", "v_pages", "block_tables", "seq_lens", "free_blocks")
# The bookkeeping first: a wrong table or free list explains wrong pages.
BOOKKEEPING_FIRST = (2, 4, 3, 0, 1)


# -- helpers -------------------------------------------------------------------------------


def _blocks_for(length: int, block_size: int) -> int:
    return -(-length // block_size)  # ceil


def _paged(inputs, seq_lens, block_size, num_blocks, heads, dim, dim_v, max_blocks=None,
           dtype=torch.float32):
    """A paged cache holding ``seq_lens`` tokens: ``(k_pages, v_pages,
    block_tables, seq_lens, free_blocks)``. Every slot holds random numbers,
    so the slots no token holds are stale; the physical blocks are a shuffle
    of the pool, given to the sequences in order; the rest are the free
    stack; each table is padded with 0."""
    k_pages = inputs.randn(num_blocks, block_size, heads, dim, dtype=dtype)
    v_pages = inputs.randn(num_blocks, block_size, heads, dim_v, dtype=dtype)
    needed = [_blocks_for(length, block_size) for length in seq_lens]
    max_blocks = max_blocks or max(needed)
    ids = inputs.permutation(num_blocks).tolist()
    tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int64)
    for b, count in enumerate(needed):
        tables[b, :count] = torch.tensor(ids[:count], dtype=torch.int64)
        ids = ids[count:]
    return k_pages, v_pages, tables, torch.tensor(seq_lens, dtype=torch.int64), torch.tensor(ids, dtype=torch.int64)


def _expect_parts(got, expected, names, call, lookalikes=None, reference="the reference", order=None):
    """A tuple answer, each part close to ``expected``'s, in ``order`` (the
    parts that explain the others first); a known bug's hint where one gives
    this part and the rest of the answer too."""
    parts = unpack(got, names, call)
    for index in order or range(len(names)):
        expect_close(parts[index], expected[index], f"{names[index]} returned by {call}", reference=reference,
                     lookalikes=None if lookalikes is None else lookalikes.part(index, got))
    return parts


def _where(page: int, slot: int, block_size: int, tables, seq_lens) -> str:
    """Which token, if any, a slot holds, in words."""
    for b, length in enumerate(seq_lens.tolist()):
        for logical in range(_blocks_for(length, block_size)):
            if int(tables[b, logical]) == page:
                token = logical * block_size + slot
                return (f"token {token} of sequence {b}" if token < length
                        else f"a stale slot of sequence {b}'s last block")
    return "nothing (a block no table names)"


# -- allocate_blocks ------------------------------------------------------------------------

# (id, F, count): a few blocks, one, every free block, none.
ALLOCATE_CASES = [
    ("F8-take3", 8, 3),
    ("F5-take1", 5, 1),
    ("F6-take-all", 6, 6),
    ("F4-take-none", 4, 0),
    ("F1-take1", 1, 1),
]


@exercise("allocate_blocks")
@pytest.mark.parametrize("case", ALLOCATE_CASES, ids=case_ids(ALLOCATE_CASES))
def test_allocate_blocks_pops_the_top_of_the_stack(submission, bugs, inputs, case):
    """gives what count pops of the free list as a Python list give: the last entry first"""
    _, size, count = case
    free = inputs.permutation(size) + 10  # block ids in shuffled order, none equal to its place
    got, call = run(submission, "allocate_blocks", free, count)
    _expect_parts(got, oracles.allocate_blocks(free, count), ("blocks", "free_blocks"), call,
                  bugs.allocate_blocks(free, count), reference="count pops of a Python list")


@exercise("allocate_blocks")
@pytest.mark.parametrize("case", ALLOCATE_CASES[:4], ids=case_ids(ALLOCATE_CASES[:4]))
def test_allocate_blocks_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference"""
    _, size, count = case
    free = inputs.permutation(size)
    got, call = run(submission, "allocate_blocks", free, count)
    _expect_parts(got, reference.allocate_blocks(free, count), ("blocks", "free_blocks"), call,
                  bugs.allocate_blocks(free, count))


@exercise("allocate_blocks")
def test_allocate_blocks_reuses_the_block_freed_last(submission, bugs, inputs):
    """a block freed (pushed onto the free list) is the next one taken; two freed, the later first"""
    # Four blocks in use; then one of them is freed, then two. The inputs are the
    # right stacks, whatever the submission returned, as the student edition needs.
    taken, left = oracles.allocate_blocks(inputs.permutation(9), 4)
    for freed in ([int(taken[1])], [int(taken[3]), int(taken[0])]):
        stack = torch.cat([left, torch.tensor(freed)])  # a sequence finished: its blocks pushed back
        count = len(freed)
        got, call = run(submission, "allocate_blocks", stack, count)
        lookalikes = bugs.allocate_blocks(stack, count)
        blocks, _ = unpack(got, ("blocks", "free_blocks"), call)
        expected = torch.tensor(freed[::-1])
        expect_close(blocks, expected, f"blocks returned by {call} after blocks {freed} were freed",
                     lookalikes=lookalikes.part(0, got),
                     reference="the freed blocks, the one freed last first")
        left = stack[:-count]


@exercise("allocate_blocks")
@pytest.mark.parametrize("size, count", [(3, 4), (0, 1)], ids=["F3-take4", "F0-take1"])
def test_allocate_blocks_raises_when_out_of_blocks(submission, bugs, inputs, size, count):
    """raises a RuntimeError (or ValueError) when more blocks are asked for than are free"""
    free = inputs.permutation(size)
    expect_raises(submission, "allocate_blocks", (free, count), {}, OUT_OF_BLOCKS,
                  f"{count} blocks asked for, {size} free", lookalikes=bugs.allocate_blocks(free, count))


# -- append_to_pages ------------------------------------------------------------------------

# (id, seq_lens, block_size, N, H, d, d_v): a token into the room of a block,
# one at the last slot, one opening a block after a full one, a new sequence
# (length 0), block size 1 (every token opens a block), a long block.
APPEND_CASES = [
    ("ragged-bs4", [5, 8, 1, 3], 4, 12, 2, 3, 2),
    ("new-and-full-bs3", [0, 3, 7, 6], 3, 12, 1, 4, 4),
    ("bs1", [2, 0, 1], 1, 8, 2, 2, 3),
    ("one-sequence-bs16", [17], 16, 4, 2, 4, 4),
]


def _append_inputs(inputs, case, dtype=torch.float32):
    _, seq_lens, block_size, num_blocks, heads, dim, dim_v = case
    room = max(_blocks_for(length + 1, block_size) for length in seq_lens)
    k_pages, v_pages, tables, lengths, free = _paged(inputs, seq_lens, block_size, num_blocks, heads, dim, dim_v,
                                                     max_blocks=room, dtype=dtype)
    k_new = inputs.randn(len(seq_lens), heads, dim, dtype=dtype)
    v_new = inputs.randn(len(seq_lens), heads, dim_v, dtype=dtype)
    return k_pages, v_pages, tables, lengths, k_new, v_new, free


def _lengths_text(lengths) -> str:
    return f"seq_lens {lengths.tolist()}"


@exercise("append_to_pages")
@pytest.mark.parametrize("case", APPEND_CASES, ids=case_ids(APPEND_CASES))
def test_append_to_pages_equals_the_oracle(submission, bugs, inputs, case):
    """equals one token a sequence written by a Python loop, blocks popped in batch order"""
    args = _append_inputs(inputs, case)
    got, call = run(submission, "append_to_pages", *args)
    _expect_parts(got, oracles.append_to_pages(*args), APPENDED, f"{call} with {_lengths_text(args[3])}",
                  bugs.append_to_pages(*args), reference="a loop over the batch", order=BOOKKEEPING_FIRST)


@exercise("append_to_pages")
@pytest.mark.parametrize("case", APPEND_CASES[:2], ids=case_ids(APPEND_CASES[:2]))
def test_append_to_pages_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference (float64)"""
    args = _append_inputs(inputs, case, dtype=torch.float64)
    got, call = run(submission, "append_to_pages", *args)
    _expect_parts(got, reference.append_to_pages(*args), APPENDED, f"{call} with {_lengths_text(args[3])}",
                  bugs.append_to_pages(*args), order=BOOKKEEPING_FIRST)


@exercise("append_to_pages")
@pytest.mark.parametrize("case", APPEND_CASES[:2], ids=case_ids(APPEND_CASES[:2]))
def test_append_to_pages_moves_no_cached_token(submission, bugs, inputs, case):
    """changes only the new tokens' slots: every other slot keeps its bytes, every block stays in its table"""
    args = _append_inputs(inputs, case)
    k_pages, v_pages, tables, lengths = args[:4]
    block_size = k_pages.shape[1]
    got, call = run(submission, "append_to_pages", *args)
    call = f"{call} with {_lengths_text(lengths)}"
    lookalikes = bugs.append_to_pages(*args)
    new_tables = oracles.append_to_pages(*args)[2]
    parts = unpack(got, APPENDED, call)
    kept = torch.ones(k_pages.shape[:2], dtype=torch.bool)  # (N, block_size): the slots that must not change
    for b, length in enumerate(lengths.tolist()):
        kept[int(new_tables[b, length // block_size]), length % block_size] = False
    for index, sent in ((0, k_pages), (1, v_pages)):
        returned = parts[index]
        expect_like(returned, sent, f"{APPENDED[index]} returned by {call}")
        changed = kept & (returned != sent).flatten(2).any(dim=-1)  # (N, block_size)
        if bool(changed.any()):
            page, slot = (int(i) for i in changed.nonzero()[0])
            fail(f"{APPENDED[index]} returned by {call} changed slot {slot} of block {page}, which holds "
                 f"{_where(page, slot, block_size, tables, lengths)} and is none of the new tokens' slots "
                 f"({int(changed.sum())} such slots changed)", hint=matching_hint(got, lookalikes.part(index, got)))
    returned = parts[2]
    expect_like(returned, tables, f"block_tables returned by {call}")
    for b, length in enumerate(lengths.tolist()):
        owned = _blocks_for(length, block_size)
        if not torch.equal(returned[b, :owned], tables[b, :owned]):
            fail(f"block_tables returned by {call}: sequence {b}'s blocks {tables[b, :owned].tolist()} became "
                 f"{returned[b, :owned].tolist()}; a block a sequence owns stays where it is (its tokens are "
                 "never copied elsewhere)", hint=matching_hint(got, lookalikes.part(2, got)))


@exercise("append_to_pages")
def test_append_to_pages_takes_a_block_only_when_the_last_is_full(submission, bugs, inputs):
    """decoding 7 tokens (block size 3), a sequence takes a block only when its last block is full"""
    args = list(_append_inputs(inputs, ("decode", [0, 2, 4], 3, 12, 2, 3, 3)))
    for _ in range(7):
        args[2] = torch.cat([args[2], torch.zeros(3, 1, dtype=torch.int64)], dim=1)  # room for one more block
        got, call = run(submission, "append_to_pages", *args)
        call = f"{call} with {_lengths_text(args[3])}"
        lookalikes = bugs.append_to_pages(*args)
        expected = oracles.append_to_pages(*args)
        parts = unpack(got, APPENDED, call)
        opening = [b for b, length in enumerate(args[3].tolist()) if length % 3 == 0]
        expect_like(parts[4], expected[4], f"free_blocks returned by {call}")
        if len(parts[4]) != len(expected[4]):
            fail(f"free_blocks returned by {call} has {len(parts[4])} blocks of {len(args[6])}: "
                 f"{len(args[6]) - len(expected[4])} should be taken, one for each sequence whose last block "
                 f"is full (sequences {opening} of {_lengths_text(args[3])}, block size 3)",
                 hint=matching_hint(got, lookalikes.part(4, got)))
        expect_close(parts[2], expected[2], f"block_tables returned by {call}",
                     lookalikes=lookalikes.part(2, got),
                     reference=f"the tables with a new block for sequences {opening} only")
        # The next step starts from the right cache, whatever this one returned.
        args = [*expected[:4], inputs.randn(3, 2, 3), inputs.randn(3, 2, 3), expected[4]]


@exercise("append_to_pages")
def test_append_to_pages_reuses_freed_blocks(submission, bugs, inputs):
    """a sequence that opens a block gets the block freed last (its table's entry is that block)"""
    k_pages, v_pages, tables, lengths, k_new, v_new, free = _append_inputs(
        inputs, ("freed", [4, 6, 2], 2, 10, 1, 2, 2))
    # Sequence 1 finishes: its blocks go back onto the stack, its last block on top.
    finished = tables[1, :3].tolist()
    free = torch.cat([free, torch.tensor(finished)])
    keep = torch.tensor([0, 2])
    args = (k_pages, v_pages, tables[keep], lengths[keep], k_new[keep], v_new[keep], free)
    got, call = run(submission, "append_to_pages", *args)
    call = f"{call} with {_lengths_text(args[3])}, after blocks {finished} were freed"
    lookalikes = bugs.append_to_pages(*args)
    expected = oracles.append_to_pages(*args)
    parts = unpack(got, APPENDED, call)
    expect_like(parts[2], expected[2], f"block_tables returned by {call}")
    for b, name in ((0, "sequence 0"), (1, "sequence 1")):
        right = int(expected[2][b, 2 if b == 0 else 1])
        if int(parts[2][b, 2 if b == 0 else 1]) != right:
            fail(f"block_tables returned by {call}: {name} opened a block and got block "
                 f"{int(parts[2][b, 2 if b == 0 else 1])}, expected block {right}: the blocks freed last are on "
                 "top of the stack and are reused first", hint=matching_hint(got, lookalikes.part(2, got)))
    expect_close(parts[4], expected[4], f"free_blocks returned by {call}", lookalikes=lookalikes.part(4, got),
                 reference="the stack without its two top blocks")


@exercise("append_to_pages")
def test_append_to_pages_raises_when_out_of_blocks(submission, bugs, inputs):
    """raises a RuntimeError (or ValueError) when more sequences open a block than blocks are free"""
    k_pages, v_pages, tables, lengths, k_new, v_new, _ = _append_inputs(inputs, ("full", [4, 2, 8], 2, 10, 1, 2, 2))
    free = inputs.permutation(10)[:2]
    args = (k_pages, v_pages, tables, lengths, k_new, v_new, free)
    expect_raises(submission, "append_to_pages", args, {}, OUT_OF_BLOCKS,
                  "3 sequences open a block, 2 blocks are free", lookalikes=bugs.append_to_pages(*args))


# -- paged_attention -------------------------------------------------------------------------

# (id, seq_lens, block_size, N, H, d, d_v, M): ragged lengths, block size 1,
# a table with padding columns, full blocks, 16-token blocks.
ATTENTION_CASES = [
    ("ragged-bs4", [5, 8, 1, 11], 4, 16, 2, 8, 8, 4),
    ("bs1", [3, 1, 4], 1, 12, 2, 4, 3, 5),
    ("padded-table", [2, 3], 4, 6, 1, 8, 8, 3),
    ("full-blocks", [6, 3], 3, 8, 3, 4, 4, 2),
    ("bs16", [33, 17], 16, 8, 2, 8, 8, 3),
]


def _attention_inputs(inputs, case, dtype=torch.float32):
    _, seq_lens, block_size, num_blocks, heads, dim, dim_v, max_blocks = case
    k_pages, v_pages, tables, lengths, _ = _paged(inputs, seq_lens, block_size, num_blocks, heads, dim, dim_v,
                                                  max_blocks=max_blocks, dtype=dtype)
    q = inputs.randn(len(seq_lens), heads, dim, dtype=dtype)
    return q, k_pages, v_pages, tables, lengths


@exercise("paged_attention")
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=case_ids(ATTENTION_CASES))
def test_paged_attention_equals_contiguous_attention(submission, bugs, inputs, case):
    """equals PyTorch's attention over each sequence's keys gathered in token order (chapter 4's cache)"""
    args = _attention_inputs(inputs, case)
    got, call = run(submission, "paged_attention", *args)
    expect_close(got, oracles.paged_attention(*args), f"{call} with {_lengths_text(args[4])}",
                 lookalikes=bugs.paged_attention(*args), axes=("heads", "features"),
                 reference="F.scaled_dot_product_attention over each sequence's contiguous keys")


@exercise("paged_attention")
@pytest.mark.parametrize("case", ATTENTION_CASES[:3], ids=case_ids(ATTENTION_CASES[:3]))
def test_paged_attention_matches_reference(submission, reference, bugs, inputs, case):
    """matches the reference (float64)"""
    args = _attention_inputs(inputs, case, dtype=torch.float64)
    got, call = run(submission, "paged_attention", *args)
    expect_close(got, reference.paged_attention(*args), f"{call} with {_lengths_text(args[4])}",
                 lookalikes=bugs.paged_attention(*args), axes=("heads", "features"))


@exercise("paged_attention")
def test_paged_attention_reads_no_stale_slot(submission, inputs):
    """new numbers in every slot no token holds (block tails, free blocks) change no output"""
    q, k_pages, v_pages, tables, lengths = _attention_inputs(inputs, ATTENTION_CASES[0])
    before, call = run(submission, "paged_attention", q, k_pages, v_pages, tables, lengths)
    call = f"{call} with {_lengths_text(lengths)}"
    expect_like(before, q, call)
    block_size = k_pages.shape[1]
    held = torch.zeros(k_pages.shape[:2], dtype=torch.bool)  # (N, block_size)
    for b, length in enumerate(lengths.tolist()):
        for t in range(length):
            held[int(tables[b, t // block_size]), t % block_size] = True
    stale_k, stale_v = k_pages.clone(), v_pages.clone()
    stale_k[~held] = 10 * inputs.randn(int((~held).sum()), *k_pages.shape[2:])
    stale_v[~held] = 10 * inputs.randn(int((~held).sum()), *v_pages.shape[2:])
    after, _ = run(submission, "paged_attention", q, stale_k, stale_v, tables, lengths)
    expect_close(after, before, f"{call} after new numbers in the {int((~held).sum())} slots no token holds "
                 "(a stale slot is read)", reference="your output before the change")


@exercise("paged_attention")
def test_paged_attention_ignores_where_the_blocks_are(submission, inputs):
    """moving the blocks to other physical places (tables changed to match) changes no output"""
    q, k_pages, v_pages, tables, lengths = _attention_inputs(inputs, ATTENTION_CASES[3])
    before, call = run(submission, "paged_attention", q, k_pages, v_pages, tables, lengths)
    call = f"{call} with {_lengths_text(lengths)}"
    expect_like(before, q, call)
    moved_to = inputs.permutation(k_pages.shape[0])  # block p goes to place moved_to[p]
    moved_k, moved_v = torch.empty_like(k_pages), torch.empty_like(v_pages)
    moved_k[moved_to], moved_v[moved_to] = k_pages, v_pages
    after, _ = run(submission, "paged_attention", q, moved_k, moved_v, moved_to[tables], lengths)
    expect_close(after, before, f"{call} after moving block p of the pool to block moved_to[p], block tables "
                 "renumbered (the block table is not followed)", reference="your output before the move")


# -- every exercise -----------------------------------------------------------------------

# append_to_pages counts the sequences that open a block, a number meta does
# not have: its case runs on a GPU only, and says so on meta.
test_would_run_on_a_gpu = portability_check([
    portable("allocate_blocks", lambda inputs: ((inputs.permutation(6), 2), {})),
    portable("append_to_pages", lambda inputs: (_append_inputs(inputs, APPEND_CASES[0]), {})),
    portable("paged_attention", lambda inputs: (_attention_inputs(inputs, ATTENTION_CASES[0]), {})),
])
