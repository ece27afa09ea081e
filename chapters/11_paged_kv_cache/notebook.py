"""Chapter 11's notebook: the cells that try each exercise.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821  (names come from the notebook's exercise cells)

# %% try allocate_blocks
free = torch.tensor([3, 0, 6, 2, 7])  # (F,) = (5,): the top of the stack is 7
print(allocate_blocks(free, 2))  # (tensor([7, 2]), tensor([3, 0, 6]))

# %% try append_to_pages
print("append_to_pages")

# %% try paged_attention
print("paged_attention")
