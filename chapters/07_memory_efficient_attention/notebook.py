"""Chapter 7's notebook: the cells that try each exercise and the one that plots.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821, E402  (names come from the notebook's exercise cells; the plot cell imports)

# %% try online_softmax
x = torch.tensor([[1.0, 3.0, 2.0, 5.0]])  # section 2's row, in blocks of 2
print(online_softmax(x, 2))  # [[0.0152, 0.1125, 0.0414, 0.8310]]
big = torch.tensor([[1000.0, 3000.0, 2000.0, 5000.0]])
print(online_softmax(big, 3))  # [[0., 0., 0., 1.]]: no inf, no NaN
print(torch.allclose(online_softmax(x, 3), torch.softmax(x, dim=-1)))  # True, 3 does not divide 4

# %% try tiled_attention
import torch.nn.functional as F

torch.manual_seed(0)
q, k, v = torch.randn(2, 6, 8), torch.randn(2, 10, 8), torch.randn(2, 10, 8)  # L = 6, S = 10
for block_size in (1, 3, 4, 10, 16):
    same = torch.allclose(tiled_attention(q, k, v, block_size), F.scaled_dot_product_attention(q, k, v),
                          atol=1e-6)
    print(f"block {block_size}:", same)  # True for every block size
causal = torch.ones(6, 10, dtype=torch.bool).tril(10 - 6)  # chapter 4's bottom-right mask, (L, S)
print("causal:", torch.allclose(tiled_attention(q, k, v, 3, causal=True),
                                F.scaled_dot_product_attention(q, k, v, attn_mask=causal), atol=1e-6))  # True

# %% try merge_attention
torch.manual_seed(0)
q, k, v = torch.randn(1, 4, 8), torch.randn(1, 10, 8), torch.randn(1, 10, 8)


def part(keys, values):
    """(output, lse) of attention over some of the keys."""
    scores = q @ keys.mT / 8**0.5
    return F.scaled_dot_product_attention(q, keys, values), torch.logsumexp(scores, dim=-1)


out, lse = merge_attention(*part(k[:, :3], v[:, :3]), *part(k[:, 3:], v[:, 3:]))
print(torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-6))  # True
print(torch.allclose(lse, torch.logsumexp(q @ k.mT / 8**0.5, dim=-1)))  # True

# %% plot
from IPython.display import SVG, display

from grader.figures import heatmap_svg

# The running max of each row of the weights, block after block, seen from your
# online softmax: every prefix of the row, in blocks of 2, gives the softmax of
# that prefix. Each row of the picture is one more block read.
x = torch.tensor([1.0, 3.0, 2.0, 5.0, 0.0, 4.0])
rows = [online_softmax(x[: end][None], 2)[0].tolist() + [0.0] * (len(x) - end) for end in (2, 4, 6)]
display(SVG(heatmap_svg(rows, ["after block 1", "after block 2", "after block 3"],
                        [f"x{j}" for j in range(len(x))], "softmax of what has been read so far")))
