"""Chapter 4's notebook: the cells that try each exercise and the one that plots.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821, E402  (names come from the notebook's exercise cells; the plot cell imports)

# %% try causal_mask
print(causal_mask(4).int())  # the lower triangle, diagonal included: [[1, 0, 0, 0], ..., [1, 1, 1, 1]]
print(causal_mask(2, 4).int())  # bottom-right: [[1, 1, 1, 0], [1, 1, 1, 1]]

# %% try causal_self_attention
x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])  # (B, T, d_model) = (1, 3, 2): section 2's example
eye = torch.eye(2)  # one head, identity projections: queries = keys = values = x
output = causal_self_attention(x, 1, eye, eye, eye, eye)
print("causal_self_attention:", tuple(x.shape), "->", tuple(output.shape))  # (1, 3, 2) -> (1, 3, 2)
print(output)  # [[[1.0000, 0.0000], [0.3302, 0.6698], [0.7517, 0.7517]]]

# %% try attend_with_cache
x, eye = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]), torch.eye(2)  # section 4: the same x0, x1, x2
_, cache = attend_with_cache(x[:, :2], 1, eye, eye, eye, eye)  # x0 and x1 first: the cache holds them
output, (k, v) = attend_with_cache(x[:, 2:], 1, eye, eye, eye, eye, cache=cache)  # then x2 alone
print("new token's output:", output)  # [[[0.7517, 0.7517]]]: row 2 of causal_self_attention
print("cache:", tuple(cache[0].shape), "->", tuple(k.shape))  # (1, 1, 2, 2) -> (1, 1, 3, 2): x2 appended

# %% plot
from IPython.display import SVG, display

from grader.figures import heatmap_svg

# Chapter 1's sentence: hand-made embeddings of width 4, each followed by the
# token's one-hot position (width 6), so x is (B, T, d_model) = (1, 6, 10).
tokens = ["the", "cat", "sat", "on", "the", "mat"]
e = torch.tensor([[2, 0, 0, 0], [0, 2, 0, 1.5], [0, 0.5, 2, 1], [0.5, 0, 1.5, 0], [2, 0, 0, 0], [0, 2, 0, 0]])
x = torch.cat([e, torch.eye(6)], dim=-1)[None]
# Queries and keys read the embedding; values read the one-hot position. Output row t is
# then sum_j weights[t, j] * onehot(j): the output of your function IS its weight matrix.
w_qk, w_v = torch.eye(10)[:4], torch.eye(10)[4:]  # (4, 10) and (6, 10)
weights = causal_self_attention(x, 1, w_qk, w_qk, w_v, torch.eye(6))[0]  # (T, T) = (6, 6)
title = "your causal_self_attention (as chapter 1's causal figure)"
display(SVG(heatmap_svg(weights.tolist(), tokens, tokens, title, masked=(~causal_mask(6)).tolist())))
