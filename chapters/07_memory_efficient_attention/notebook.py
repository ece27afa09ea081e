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

q = torch.tensor([[1.0]])  # section 3's worked example: one query, d = 1
k, v = torch.tensor([[1.0], [3.0], [2.0], [5.0]]), torch.tensor([[10.0], [20.0], [30.0], [40.0]])
print(tiled_attention(q, k, v, 2))  # (tensor([[36.8806]]), tensor([5.1852])): out and lse

torch.manual_seed(0)
q, k, v = torch.randn(2, 6, 8), torch.randn(2, 10, 8), torch.randn(2, 10, 8)  # L = 6, S = 10
for block_size in (1, 3, 4, 10, 16):
    out, lse = tiled_attention(q, k, v, block_size)
    same = (torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-6)
            and torch.allclose(lse, torch.logsumexp(q @ k.mT / 8**0.5, dim=-1)))
    print(f"block {block_size}:", same)  # True for every block size
causal = torch.ones(6, 10, dtype=torch.bool).tril(10 - 6)  # chapter 4's bottom-right mask, (L, S)
out, lse = tiled_attention(q, k, v, 3, causal=True)
print("causal:", torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=causal), atol=1e-6))  # True
out, lse = tiled_attention(torch.randn(1, 12, 8), k[:1], v[:1], 4, causal=True)  # 12 queries, 10 keys
print(out[0, :2].abs().sum().item(), lse[0, :2])  # 0.0 tensor([-inf, -inf]): queries 0 and 1 see no key

# %% try merge_attention
torch.manual_seed(0)
q, k, v = torch.randn(1, 4, 8), torch.randn(1, 10, 8), torch.randn(1, 10, 8)
# Section 5's road: your tiled_attention over keys 0 .. 2 and over keys 3 .. 9, merged.
out, lse = merge_attention(*tiled_attention(q, k[:, :3], v[:, :3], 2), *tiled_attention(q, k[:, 3:], v[:, 3:], 2))
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
