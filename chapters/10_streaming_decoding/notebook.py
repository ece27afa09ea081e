"""Chapter 10's notebook: the cells that try each exercise.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
A "# %% plot" cell, if any, draws from the student's own functions.
"""
# ruff: noqa: F821  (names come from the notebook's exercise cells)

# %% try sliding_window_mask
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("sliding_window_mask:", sliding_window_mask(x))  # TODO: what a correct answer prints

# %% try rolling_cache_append
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("rolling_cache_append:", rolling_cache_append(x))  # TODO: what a correct answer prints

# %% try streaming_attention_step
x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (T, d) = (2, 2). TODO: the lesson's small example
print("streaming_attention_step:", streaming_attention_step(x))  # TODO: what a correct answer prints
