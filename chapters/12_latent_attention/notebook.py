"""Chapter 12's notebook: the cells that try each exercise.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821  (names come from the notebook's exercise cells)

# %% try MultiHeadLatentAttention
# Section 5's example: one head, D = 2, d_h = d_R = 2, d_c = d_c' = 1, weights set by hand.
by_hand = {"q_down": [[1.0, 1.0]], "q_up": [[1.0], [0.0]], "q_rope": [[0.0], [1.0]], "kv_down": [[0.0, 1.0]],
           "k_up": [[2.0], [0.0]], "v_up": [[1.0], [-1.0]], "k_rope": [[1.0, 0.0], [0.0, 1.0]],
           "out_proj": [[1.0, 0.0], [0.0, 1.0]]}
x = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # (B, T, D) = (1, 2, 2): h_0 and h_1
mla = MultiHeadLatentAttention(d_model=2, num_heads=1, head_dim=2, rope_dim=2, kv_rank=1, q_rank=1)
mla.load_state_dict({f"{name}.weight": torch.tensor(value) for name, value in by_hand.items()})
with torch.no_grad():
    print(mla(x))  # [[[0, 0], [0.8722, -0.8722]]]
with torch.device("meta"):  # shapes only: DeepSeek-V2's attention layer
    big = MultiHeadLatentAttention(5120, 128, 128, 64, 512, 1536)
print({name: tuple(p.shape) for name, p in big.named_parameters()})
# q_down (1536, 5120), q_up (16384, 1536), q_rope (8192, 1536), kv_down (512, 5120),
# k_up (16384, 512), v_up (16384, 512), k_rope (64, 5120), out_proj (5120, 16384)

# %% try absorbed_decode
# The module of the cell above, built again: this cell runs even where that one stopped.
mla = MultiHeadLatentAttention(d_model=2, num_heads=1, head_dim=2, rope_dim=2, kv_rank=1, q_rank=1)
mla.load_state_dict({f"{name}.weight": torch.tensor(value) for name, value in by_hand.items()})
with torch.no_grad():
    first, cache = absorbed_decode(mla, x[:, :1])  # token 0, no cache yet
    second, cache = absorbed_decode(mla, x[:, 1:], cache)  # token 1, at position 1
print(first, second)  # [[[0, 0]]] [[[0.8722, -0.8722]]]: the rows of mla(x)
print(cache[0], cache[1])  # latents [[[0], [1]]], rope keys [[[1, 0], [-0.8415, 0.5403]]]
torch.manual_seed(0)
small = MultiHeadLatentAttention(16, 4, 4, 4, 6, 8)
tokens, cache, rows = torch.randn(2, 5, 16), None, []
with torch.no_grad():
    for t in range(5):  # one token at a time, each time with the cache the last step returned
        row, cache = absorbed_decode(small, tokens[:, t:t + 1], cache)
        rows.append(row)
    print(torch.allclose(torch.cat(rows, dim=1), small(tokens), atol=1e-5))  # True
print(tuple(cache[0].shape), tuple(cache[1].shape))  # (2, 5, 6) (2, 5, 4): nothing per head

# %% try latent_cache_bytes
per_token = latent_cache_bytes(1, 1, 60, 128, 128, 512, 64, torch.bfloat16)  # DeepSeek-V2, one token
print(per_token, 2 * 60 * 128 * 128 * 2)  # 69120 3932160: chapter 6's multi-head cache
print(latent_cache_bytes(8, 128 * 1024, 60, 128, 128, 512, 64, torch.bfloat16) / 2**30)  # 67.5 (GiB)
print(latent_cache_bytes(1, 1, 60, 1, 64, 512, 64, torch.bfloat16))  # 69120 again: no heads in it
