"""Chapter 11's notebook: the cells that try each exercise.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples (section 5), and prints what a correct answer gives in a
trailing comment.
"""
# ruff: noqa: F821  (names come from the notebook's exercise cells)

# %% try allocate_blocks
free = torch.tensor([0, 3, 1, 6, 4])  # (F,): the top of the stack is 4
print(allocate_blocks(free, 2))  # (tensor([4, 6]), tensor([0, 3, 1]))
print(allocate_blocks(free, 0))  # (tensor([], dtype=torch.int64), tensor([0, 3, 1, 6, 4]))
try:
    allocate_blocks(free, 6)
except (RuntimeError, ValueError) as error:
    print("out of blocks:", error)  # raised: 6 asked for, 5 free

# %% try append_to_pages
k_pages = torch.full((8, 2, 1, 2), 9.0)  # (N, block_size, H, d): 8 blocks of 2 slots, stale 9s
v_pages = torch.full((8, 2, 1, 2), 9.0)
for (page, slot), key in {(5, 0): [2.0, 0.0], (5, 1): [0.0, 2.0], (2, 0): [1.0, 1.0]}.items():
    k_pages[page, slot, 0] = v_pages[page, slot, 0] = torch.tensor(key)  # sequence A: 3 tokens in [5, 2]
k_pages[7, :, 0] = v_pages[7, :, 0] = torch.eye(2)  # sequence B: keys (1, 0), (0, 1) in block 7
tables, lengths = torch.tensor([[5, 2, 0], [7, 0, 0]]), torch.tensor([3, 2])  # (B, M), (B,)
k_new = torch.tensor([[[0.0, 0.0]], [[1.0, 1.0]]])  # (B, H, d)
v_new = torch.tensor([[[1.0, 1.0]], [[2.0, 2.0]]])  # (B, H, d_v)
k_pages, v_pages, tables, lengths, free = append_to_pages(
    k_pages, v_pages, tables, lengths, k_new, v_new, torch.tensor([0, 3, 1, 6, 4]))
print(tables.tolist(), lengths.tolist(), free.tolist())  # [[5, 2, 0], [7, 4, 0]] [4, 3] [0, 3, 1, 6]
print(k_pages[4, :, 0].tolist())  # [[1.0, 1.0], [9.0, 9.0]]: B's new key, then a stale slot

# %% try paged_attention
q = torch.ones(2, 1, 2)  # (B, H, d): q = (1, 1) for both sequences
print(paged_attention(q, k_pages, v_pages, tables, lengths)[1])  # tensor([[1.2552, 1.2552]])
print(paged_attention(q, k_pages, v_pages, tables, lengths + 1)[1])  # one stale slot read: about 9
