"""Chapter 8's notebook: the cells that try each exercise and the one that plots.

Each "try" cell runs right after the exercise it is named for, on small
examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821, E402  (names come from the notebook's exercise cells; the plot cell imports)

# %% try TransformerBlock
torch.manual_seed(0)
block = TransformerBlock(d_model=8, num_heads=2)
x = torch.randn(2, 5, 8)  # (B, T, D)
y = block(x)
print(y.shape)  # torch.Size([2, 5, 8])
changed = x.clone()
changed[:, -1] = torch.randn(2, 8)  # change only the last position
print(torch.allclose(block(changed)[:, :-1], y[:, :-1]))  # True: earlier positions cannot see it

# %% try TinyLM
torch.manual_seed(0)
model = TinyLM(vocab_size=11, d_model=8, num_heads=2, num_layers=2, context=8)
tokens = torch.randint(11, (3, 6))  # (B, T), T <= context
print(model(tokens).shape)  # torch.Size([3, 6, 11])
print(sorted(name for name in model.state_dict() if not name.startswith("blocks")))
# ['head.bias', 'head.weight', 'ln_f.bias', 'ln_f.weight', 'pos_emb.weight', 'tok_emb.weight']

# %% try train
from grader.catalog import COURSE_ROOT

# The course's folder holds the lessons beside the grader: the chapter's text is there.
text = (COURSE_ROOT / "chapters" / "08_tiny_language_model" / "text.txt").read_text(encoding="utf-8")
alphabet = sorted(set(text))
ids = torch.tensor([alphabet.index(char) for char in text])  # (N,) one id a character
losses = train(ids, len(alphabet), steps=200, seed=0)
print(len(losses), round(losses[0], 2), round(sum(losses[-10:]) / 10, 2))  # 200, about 3.5, about 1.8

# %% plot
from IPython.display import SVG, display

from grader.figures import heatmap_svg

# What head 0 of a fresh model's first block looks at over the first 12
# characters of the text, recomputed from your TinyLM's own weights: the
# causal mask shows as the zeros above the diagonal. (train builds its own
# model and does not return it; to see trained heads, copy its loop here.)
torch.manual_seed(0)
model = TinyLM(len(alphabet), 32, 2, 1, 32)
window = ids[None, :12]  # (1, 12)
block = model.blocks[0]
h = block.ln1(model.tok_emb(window) + model.pos_emb(torch.arange(12)))  # (1, 12, D)
q, k, _ = block.qkv(h).split(32, dim=-1)
scores = q[0, :, :16] @ k[0, :, :16].T / 4  # head 0: (12, 12)
weights = torch.softmax(scores.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf")), dim=-1)
labels = [repr(char)[1:-1] for char in text[:12]]
display(SVG(heatmap_svg(weights.tolist(), labels, labels, "head 0 of block 0 (untrained weights)")))
