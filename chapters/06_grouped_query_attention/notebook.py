"""Chapter 6's notebook: the cells that try each exercise and the one that plots.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821, E402  (names come from the notebook's exercise cells; the plot cell imports)

# %% try expand_kv_heads
kv = torch.tensor([10.0, 20.0]).view(1, 2, 1, 1)  # (B, H_kv, S, d): K/V heads 0 and 1 (section 4)
print("expand_kv_heads:", expand_kv_heads(kv, 4).flatten())  # [10, 10, 20, 20], not [10, 20, 10, 20]
print("MQA:", expand_kv_heads(kv[:, :1], 3).flatten())  # [10, 10, 10]
print("MHA:", torch.equal(expand_kv_heads(kv, 2), kv))  # True: groups of one change nothing

# %% try grouped_query_attention
q = torch.tensor([[2.0, 0.0], [0.0, 2.0]]).view(1, 2, 1, 2)  # (B, H_q, L, d): section 5's example
k = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).view(1, 1, 2, 2)  # (B, H_kv, S, d): one K/V head
v = torch.tensor([[10.0, 0.0], [0.0, 10.0]]).view(1, 1, 2, 2)
output, weights = grouped_query_attention(q, k, v)
print("weights:", weights.flatten())  # [0.8044, 0.1956, 0.1956, 0.8044]
print("output:", output.flatten())  # [8.0443, 1.9557, 1.9557, 8.0443]
import torch.nn.functional as F

torch.manual_seed(0)
q, k, v = torch.randn(2, 8, 5, 4), torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 4)  # 8 query heads, 2 K/V
try:
    theirs = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # torch >= 2.5
    print("same as enable_gqa:", torch.allclose(grouped_query_attention(q, k, v)[0], theirs, atol=1e-6))  # True
except TypeError:
    print("this torch has no enable_gqa (it came with torch 2.5)")

# %% try GroupedQueryAttention
with torch.device("meta"):  # shapes only: no memory, no random numbers
    gqa = GroupedQueryAttention(4096, num_heads=32, num_kv_heads=8)  # LLaMA 3 8B's attention
print({name: tuple(p.shape) for name, p in gqa.named_parameters()})
# q_proj (4096, 4096), k_proj (1024, 4096), v_proj (1024, 4096), out_proj (4096, 4096)
print("weights:", sum(p.numel() for p in gqa.parameters()))  # 41943040, against 67108864 for MHA
torch.manual_seed(0)
small = GroupedQueryAttention(8, num_heads=4, num_kv_heads=2).eval()
causal = torch.ones(5, 5, dtype=torch.bool).tril()  # True = may attend
print(tuple(small(torch.randn(2, 5, 8), mask=causal).shape))  # (2, 5, 8)

# %% try kv_cache_bytes
for name, num_kv_heads in [("MHA", 32), ("GQA", 8), ("MQA", 1)]:  # LLaMA-3-8B-like, 8 x 8192 tokens
    size = kv_cache_bytes(8, 8192, 32, num_kv_heads, 128, torch.bfloat16)
    print(f"{name}: {size} bytes = {size / 2**30:g} GiB")  # 32 GiB, 8 GiB, 1 GiB
print("one token of LLaMA 3 8B:", kv_cache_bytes(1, 1, 32, 8, 128, torch.bfloat16))  # 131072 (128 KiB)

# %% plot
from IPython.display import SVG, display

from grader.figures import heatmap_svg

# Which K/V head each query head reads, seen in your weights: H_kv keys, and K/V head j
# scores its key j high (8) and the others 0. Every query is 1, so query head h puts its
# weight on the key its K/V head favours: key h // group. One row per query head.
for num_kv_heads in (8, 2, 1):
    q = torch.ones(1, 8, 1, 1)  # (B, H_q, L, d): 8 query heads, one query each, d = 1
    k = 8 * torch.eye(num_kv_heads).view(1, num_kv_heads, num_kv_heads, 1)  # (B, H_kv, S, d)
    _, weights = grouped_query_attention(q, k, torch.ones_like(k))  # (1, 8, 1, H_kv)
    display(SVG(heatmap_svg(weights.view(8, num_kv_heads).tolist(), [f"q {h}" for h in range(8)],
                            [f"key {j}" for j in range(num_kv_heads)],
                            f"your grouped_query_attention, {num_kv_heads} K/V heads")))
