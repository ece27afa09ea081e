"""Chapter 13's notebook: the cell that tries the exercise.

The "try" cell runs right after the exercise, on the lesson's small
example, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821  (names come from the notebook's exercise cells)

# %% try sliding_window_mask
print(sliding_window_mask(torch.arange(4), 2).int())  # [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
print(sliding_window_mask(torch.tensor([0, 1, 5]), 2).int())  # a gap: [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
