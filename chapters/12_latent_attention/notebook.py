"""Chapter 12's notebook: the cells that try each exercise.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
A "# %% plot" cell, if any, draws from the student's own functions.
"""
# ruff: noqa: F821  (names come from the notebook's exercise cells)

# %% try MultiHeadLatentAttention
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("MultiHeadLatentAttention:", MultiHeadLatentAttention(x))  # TODO: what a correct answer prints

# %% try absorbed_decode
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("absorbed_decode:", absorbed_decode(x))  # TODO: what a correct answer prints

# %% try latent_cache_bytes
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("latent_cache_bytes:", latent_cache_bytes(x))  # TODO: what a correct answer prints
