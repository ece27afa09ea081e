"""Chapter 11's notebook: the cells that try each exercise.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
A "# %% plot" cell, if any, draws from the student's own functions.
"""
# ruff: noqa: F821  (names come from the notebook's exercise cells)

# %% try BlockAllocator
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("BlockAllocator:", BlockAllocator(x))  # TODO: what a correct answer prints

# %% try append_to_pages
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("append_to_pages:", append_to_pages(x))  # TODO: what a correct answer prints

# %% try paged_attention
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("paged_attention:", paged_attention(x))  # TODO: what a correct answer prints
