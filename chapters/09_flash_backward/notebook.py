"""Chapter 9's notebook: the cells that try each exercise.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
A "# %% plot" cell, if any, draws from the student's own functions.
"""
# ruff: noqa: F821  (names come from the notebook's exercise cells)

# %% try flash_attention_forward
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("flash_attention_forward:", flash_attention_forward(x))  # TODO: what a correct answer prints

# %% try flash_attention_backward
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("flash_attention_backward:", flash_attention_backward(x))  # TODO: what a correct answer prints

# %% try FlashAttentionFunction
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("FlashAttentionFunction:", FlashAttentionFunction(x))  # TODO: what a correct answer prints
