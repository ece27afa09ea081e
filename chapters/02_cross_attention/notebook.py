"""Chapter 2's notebook: the cells that try each exercise and the one that plots.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821, E402  (names come from the notebook's exercise cells; the plot cell imports)

# %% try padding_mask
lengths = torch.tensor([3, 5, 2])  # the padded batch of section 2
print(padding_mask(lengths).int())  # [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
print("with max_len=7:", tuple(padding_mask(lengths, max_len=7).shape))  # (3, 7)

# %% try convert_mask
attend = torch.tensor([[True, True, False]])  # key 2 is padding (section 3)
print("block:   ", convert_mask(attend, "attend", "block"))  # [[False, False, True]]
additive = convert_mask(attend, "attend", "additive")
print("additive:", additive)  # [[0., 0., -inf]]
print("and back:", convert_mask(additive, "additive", "attend"))  # [[True, True, False]]

# %% try combine_masks
key_padding = padding_mask(torch.tensor([3, 1]))  # (B, S) = (2, 3)
causal = torch.ones(3, 3, dtype=torch.bool).tril()  # (L, S)
print("padding only:", tuple(combine_masks(key_padding).shape))  # (2, 1, 1, 3)
combined = combine_masks(key_padding, causal)
print("with causal:", tuple(combined.shape))  # (2, 1, 3, 3)
print(combined[1, 0].int())  # sequence 1 has one real key: [[1, 0, 0], [1, 0, 0], [1, 0, 0]]

# %% try cross_attention
torch.manual_seed(0)
x, context = torch.randn(2, 3, 6), torch.randn(2, 5, 4)  # (B, L, d_x), (B, S, d_c)
w_q, w_k, w_v = torch.randn(8, 6), torch.randn(8, 4), torch.randn(5, 4)  # d_k = 8, d_v = 5
output, weights = cross_attention(x, context, w_q, w_k, w_v, context_lengths=torch.tensor([5, 2]))
print("cross_attention:", tuple(output.shape), tuple(weights.shape))  # (2, 3, 5) (2, 3, 5)
print("sequence 1 (2 real keys):", weights[1].round(decimals=2))  # columns 2, 3, 4 are 0; rows sum to 1

# %% plot
from IPython.display import SVG, display

from grader.figures import heatmap_svg

# The lesson's figure (section 3): "le chat dort" (x, 3 queries) reads "the cat sleeps"
# (context, padded to S = 5 with zeros). Hand-made vectors of width 4, identity projections.
queries, keys = ["le", "chat", "dort"], ["the", "cat", "sleeps", "<pad>", "<pad>"]
x = torch.tensor([[[2.0, 0, 0, 0], [0, 2, 0, 0.5], [0, 0.5, 2, 0]]])  # (B, L, d_x) = (1, 3, 4)
context = torch.tensor([[[2.0, 0, 0, 0], [0, 2, 0, 1], [0, 0, 2, 1], [0, 0, 0, 0], [0, 0, 0, 0]]])
lengths, eye = torch.tensor([3]), torch.eye(4)
_, weights = cross_attention(x, context, eye, eye, eye, context_lengths=lengths)  # (1, 3, 5)
padded = ~padding_mask(lengths, max_len=5)[0]  # (S,): True at the padded keys, drawn grey
masked = [padded.tolist()] * len(queries)  # padding hides columns: the same for every query
title = "your cross_attention: the padded keys get 0"
display(SVG(heatmap_svg(weights[0].tolist(), queries, keys, title, masked=masked)))
