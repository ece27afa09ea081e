"""Chapter 1's notebook: the cells that try each exercise and the one that plots.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821, E402  (names come from the notebook's exercise cells; the plot cell imports)

# %% try softmax
x = torch.tensor([[1000.0, 1001.0, 1002.0], [0.0, float("-inf"), 0.0]])  # huge logits; a masked entry
w = softmax(x)
print("softmax:", w)  # [[0.0900, 0.2447, 0.6652], [0.5000, 0.0000, 0.5000]], no nan
print("rows sum to:", w.sum(dim=-1))  # [1., 1.]

# %% try scaled_dot_product_attention
q = torch.tensor([[1.0, 2.0]])  # (L, d_k) = (1, 2): the worked example of section 1
k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # (S, d_k) = (3, 2)
v = torch.tensor([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]])  # (S, d_v) = (3, 2)
output, weights = scaled_dot_product_attention(q, k, v, scale=1.0)
print("weights:", weights)  # [[0.0900, 0.2447, 0.6652]]
print("output:", output)  # [[4.2265, 5.7735]]

# %% try self_attention
torch.manual_seed(0)
x = torch.randn(2, 5, 8)  # (B, T, d_model)
w_q, w_k, w_v = torch.randn(4, 8), torch.randn(4, 8), torch.randn(3, 8)  # d_k = 4, d_v = 3
output, weights = self_attention(x, w_q, w_k, w_v)
print("output:", tuple(output.shape), "weights:", tuple(weights.shape))  # (2, 5, 3) (2, 5, 5)
print("rows of weights sum to:", weights.sum(dim=-1))  # all 1

# %% try softmax_numpy
x = np.array([1000.0, 1001.0, 1002.0], dtype=np.float32)
w = softmax_numpy(x)
print("softmax_numpy:", w, w.dtype)  # [0.09003057 0.24472846 0.66524094] float32

# %% try scaled_dot_product_attention_numpy
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, n, 4)).astype(np.float32) for n in (3, 5, 5))  # (B, L|S, d)
output, weights = scaled_dot_product_attention_numpy(q, k, v)
print("numpy:", output.shape, weights.shape, output.dtype)  # (2, 3, 4) (2, 3, 5) float32
expected, _ = scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v))
print("largest difference from your torch version:", np.abs(output - expected.numpy()).max())  # about 1e-7

# %% plot
from IPython.display import SVG, display

from grader.figures import heatmap_svg

# The lesson's sentence (section 5): hand-made embeddings of width 4, and
# identity projections, so the weights are softmax(x x^T / sqrt(4)).
tokens = ["the", "cat", "sat", "on", "the", "mat"]
x = torch.tensor([[2, 0, 0, 0], [0, 2, 0, 1.5], [0, 0.5, 2, 1], [0.5, 0, 1.5, 0], [2, 0, 0, 0], [0, 2, 0, 0]])
eye = torch.eye(4)
_, weights = self_attention(x, eye, eye, eye)  # (T, T) = (6, 6)
display(SVG(heatmap_svg(weights.tolist(), tokens, tokens, "your self_attention: both 'the' rows match")))
# The same with the causal mask of section 6 (True = may attend): grey cells are masked.
causal = torch.ones(6, 6, dtype=torch.bool).tril()
_, weights = self_attention(x, eye, eye, eye, mask=causal)
display(SVG(heatmap_svg(weights.tolist(), tokens, tokens, "with a causal mask", masked=(~causal).tolist())))
