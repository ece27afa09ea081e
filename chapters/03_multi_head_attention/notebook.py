"""Chapter 3's notebook: the cells that try each exercise and the one that plots.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821, E402  (names come from the notebook's exercise cells; the plot cell imports)

# %% try split_heads
x = torch.arange(8.0).reshape(2, 4)  # (T, D) = (2, 4): token 0 is [0, 1, 2, 3] (section 2)
heads = split_heads(x, num_heads=2)
print("split_heads:", tuple(x.shape), "->", tuple(heads.shape))  # (2, 4) -> (2, 2, 2)
print(heads)  # head 0: [[0, 1], [4, 5]], head 1: [[2, 3], [6, 7]]

# %% try merge_heads
x = torch.randn(2, 5, 8)  # (B, T, D)
merged = merge_heads(split_heads(x, num_heads=2))
print("merge_heads:", tuple(split_heads(x, 2).shape), "->", tuple(merged.shape))  # (2, 2, 5, 4) -> (2, 5, 8)
print("merge_heads undoes split_heads:", torch.equal(merged, x))  # True

# %% try multi_head_attention
x = torch.tensor([[1.0, 0, 2, 0], [0, 1, 0, 2], [1, 1, 0, 0]])  # (T, D) = (3, 4): section 3's example
eye = torch.eye(4)  # identity projections: q = k = v = x, and w_o = I
print(multi_head_attention(x, x, x, 2, eye, eye, eye, eye))
# [[0.8022, 0.5989, 1.7886, 0.1057], [0.5989, 0.8022, 0.1057, 1.7886], [0.7517, 0.7517, 0.6667, 0.6667]]

# %% try MultiHeadAttention
torch.manual_seed(0)
mha = MultiHeadAttention(8, num_heads=2).eval()
output, weights = mha(torch.randn(2, 5, 8), need_weights=True)  # x: (B, T, D) = (2, 5, 8)
print("output:", tuple(output.shape), "weights:", tuple(weights.shape))  # (2, 5, 8) (2, 2, 5, 5)
print("rows of weights sum to 1:", torch.allclose(weights.sum(dim=-1), torch.ones(2, 2, 5)))  # True

# %% try torch_multihead_forward
mha = nn.MultiheadAttention(8, num_heads=2)  # sequence first by default
x = torch.randn(5, 2, 8)  # (L, N, E)
expected, _ = mha(x, x, x)
params = (mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias)
mine = torch_multihead_forward(x, x, x, 2, *params)
print(tuple(mine.shape), "largest difference:", (mine - expected).abs().max().item())  # (5, 2, 8), below 1e-6

# %% try parameter_count
torch_count = sum(p.numel() for p in nn.MultiheadAttention(512, 8).parameters())
print("parameter_count(512, 8):", parameter_count(512, 8), "nn.MultiheadAttention:", torch_count)  # 1050624
print("without bias:", parameter_count(512, 8, bias=False))  # 1048576
print("one head:", parameter_count(512, 1))  # 1050624: heads add no parameters

# %% plot
from IPython.display import SVG, display

from grader.figures import heatmap_svg

# Two heads of section 1's figure, set by hand in your module: tokens are one-hot
# positions; head 0 matches query t with key t - 1, head 1 with key t (a match scores 4).
tokens, T = ["the", "cat", "sat", "on", "the", "mat"], 6
eye, shift = 3.13 * torch.eye(T), 3.13 * torch.eye(T).roll(1, dims=0)  # shift: key s looks like s + 1
w_qkv = torch.cat([eye, eye, shift, eye, eye, eye])  # [W_q; W_k; W_v], head 0's rows then head 1's
mha = MultiHeadAttention(2 * T, num_heads=2, bias=False).eval()  # D = 12: x uses its first 6 features
mha.load_state_dict({"qkv.weight": F.pad(w_qkv, (0, T)), "out.weight": torch.eye(2 * T)})
causal = torch.ones(T, T, dtype=torch.bool).tril()  # True = may attend
_, weights = mha(torch.eye(T, 2 * T), mask=causal, need_weights=True)  # x: (T, D); weights: (H, T, T)
for h, title in enumerate(["your head 0: previous token", "your head 1: same token"]):
    display(SVG(heatmap_svg(weights[h].tolist(), tokens, tokens, title, masked=(~causal).tolist())))
