"""Chapter 5's notebook: the cells that try each exercise and the one that plots.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821, E402  (names come from the notebook's exercise cells; the plot cell imports)

# %% try rope_angles
angles = rope_angles(torch.tensor([0, 1, 2]), head_dim=4)  # frequencies 1 and 0.01
print("rope_angles:", tuple(angles.shape), angles.dtype)  # (3, 2) torch.float32
print(angles)  # [[0, 0], [1, 0.01], [2, 0.02]]

# %% try apply_rope
x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # (T, d) = (1, 4): section 5's example, at position 2
rotated = apply_rope(x, torch.tensor([2]))
print("apply_rope:", rotated)  # [[-2.2347, 0.0770, 2.9194, 4.0592]]
print("lengths:", round(x.norm().item(), 4), round(rotated.norm().item(), 4))  # both sqrt(30) = 5.4772
print("position 0 changes nothing:", torch.allclose(apply_rope(x, torch.tensor([0])), x))  # True

# %% try apply_rope_half
x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # the same x at position 2
rotated = apply_rope_half(x, torch.tensor([2]))  # pairs (1, 3) and (2, 4) this time (section 6)
print("apply_rope_half:", rotated)  # [[-3.1440, 1.9196, -0.3391, 4.0392]]
print("lengths:", round(x.norm().item(), 4), round(rotated.norm().item(), 4))  # both 5.4772

# %% try adjacent_to_half_permutation
perm = adjacent_to_half_permutation(8)
print("perm:", perm)  # [0, 2, 4, 6, 1, 3, 5, 7]
torch.manual_seed(0)
x, positions = torch.randn(5, 8), torch.arange(5)
same = torch.allclose(apply_rope_half(x[..., perm], positions), apply_rope(x, positions)[..., perm])
print("apply_rope_half(x[perm]) == apply_rope(x)[perm]:", same)  # True

# %% try rope_self_attention
torch.manual_seed(0)
w_q, w_k, w_v, w_o = (torch.randn(8, 8) / math.sqrt(8) for _ in range(4))  # D = 8, 2 heads of d = 4
x = torch.randn(2, 5, 8)  # (B, T, D)
output = rope_self_attention(8, 2, 256, 10000.0, w_q, w_k, w_v, w_o, x)  # positions 0 .. 4
shifted = rope_self_attention(8, 2, 256, 10000.0, w_q, w_k, w_v, w_o, x, torch.arange(100, 105))  # all + 100
print(tuple(output.shape), "change:", (output - shifted).abs().max().item())  # (2, 5, 8), about 1e-7

# %% plot
from IPython.display import SVG, display

from grader.figures import heatmap_svg

# Six copies of one word: without positions their scores are all equal and every weight
# is 1/6. RoPE turns copy m by m * theta^(-2k/d), so scores depend on m - n only: each
# copy attends most to itself and its neighbours, whatever its position.
x = torch.full((6, 8), 1.5)  # (T, d): the same vector at every position
for start in (0, 100):  # shifting every position changes no weight
    positions = torch.arange(start, start + 6)
    q = k = apply_rope(x, positions)  # identity projections: rotated queries and keys
    weights = torch.softmax(q @ k.T / math.sqrt(8), dim=-1)  # (T, T)
    labels = [f"ha {p}" for p in positions.tolist()]
    title = f"your apply_rope, positions {start} to {start + 5}"
    display(SVG(heatmap_svg(weights.tolist(), labels, labels, title)))
