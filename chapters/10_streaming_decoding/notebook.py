"""Chapter 10's notebook: the cells that try each exercise and the one that plots.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821, E402  (names come from the notebook's exercise cells; the plot cell imports)

# %% try sliding_window_mask
print(sliding_window_mask(6, 6, 3, 1).int())  # section 2: row 4 is [1, 0, 1, 1, 1, 0], row 5 [1, 0, 0, 1, 1, 1]
print(sliding_window_mask(1, 11, 4, 2).nonzero()[:, 1])  # token 10's keys: tensor([ 0,  1,  7,  8,  9, 10])

# %% try rolling_cache_append
k, v = torch.zeros(1, 1, 6, 1), torch.zeros(1, 1, 6, 1)  # section 3: 6 slots, 2 sinks; key of token t = t
for t in range(11):
    k, v = rolling_cache_append(k, v, torch.full((1, 1, 1, 1), float(t)), torch.zeros(1, 1, 1, 1), t, 2)
    if t in (9, 10):
        print(f"after token {t}:", k.flatten().int().tolist())  # [0, 1, 6, 7, 8, 9], then [0, 1, 10, 7, 8, 9]
print(tuple(k.shape))  # (1, 1, 6, 1): the buffer never grows

# %% try streaming_attention_step
torch.manual_seed(0)
x = torch.randn(1, 12, 8)  # (B, T, d_model): a text of 12 tokens
weights = [torch.randn(8, 8) / 8**0.5 for _ in range(4)]  # w_q, w_k, w_v, w_o
k_cache, v_cache = torch.zeros(1, 2, 6, 4), torch.zeros(1, 2, 6, 4)  # 2 heads, 6 slots
outputs = []
for t in range(12):  # no RoPE: must equal attention under the sink-plus-window mask
    out, (k_cache, v_cache) = streaming_attention_step(x[:, t:t + 1], 2, *weights, k_cache, v_cache, t, 2, None)
    outputs.append(out)
q, k, v = (torch.nn.functional.linear(x, w).view(1, 12, 2, 4).transpose(1, 2) for w in weights[:3])
mask = sliding_window_mask(12, 12, 4, 2)
full = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(1, 12, 8)
print(torch.allclose(torch.cat(outputs, dim=1), full @ weights[3].T, atol=1e-5))  # True
print(tuple(k_cache.shape))  # (1, 2, 6, 4), after 12 tokens

# %% plot
from IPython.display import SVG, display

from grader.figures import heatmap_svg

allowed = sliding_window_mask(11, 11, 4, 2)  # your mask: section 2's figure
uniform = allowed.float() / allowed.sum(dim=-1, keepdim=True)  # equal weights over the keys each token sees
labels = [str(t) for t in range(11)]
display(SVG(heatmap_svg(uniform.tolist(), labels, labels, "your sliding_window_mask(11, 11, 4, 2)",
                        masked=(~allowed).tolist())))
