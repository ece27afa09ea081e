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
# With a cache: positions 0 .. 2 first, then 3 and 4, give forward's last two rows.
_, cache = block.forward_with_cache(x[:, :3])
print([tuple(t.shape) for t in cache])  # [(2, 2, 3, 4), (2, 2, 3, 4)]: (B, H, T_past, d)
out, cache = block.forward_with_cache(x[:, 3:], cache)
print(torch.allclose(out, y[:, 3:], atol=1e-6), cache[0].shape[2])  # True 5: the cache grew by two

# %% try TinyLM
torch.manual_seed(0)
# A small model of its own name: `model` is the one train gives below.
lm = TinyLM(vocab_size=11, d_model=8, num_heads=2, num_layers=2, context=8)
tokens = torch.randint(11, (3, 6))  # (B, T), T <= context
print(lm(tokens).shape)  # torch.Size([3, 6, 11])
print(sorted(name for name in lm.state_dict() if not name.startswith("blocks")))
# ['head.bias', 'head.weight', 'ln_f.bias', 'ln_f.weight', 'pos_emb.weight', 'tok_emb.weight']
logits, cache = lm.forward_with_cache(tokens[:, :4])  # (3, 4, 11), one (k, v) a block
last, cache = lm.forward_with_cache(tokens[:, 4:5], cache)  # token 4 at position 4
print(len(cache), torch.allclose(last, lm(tokens[:, :5])[:, 4:], atol=1e-5))  # 2 True

# %% try train
from grader.catalog import COURSE_ROOT

# The course's folder holds the lessons beside the grader: the chapter's text is there.
text = (COURSE_ROOT / "chapters" / "08_tiny_language_model" / "text.txt").read_text(encoding="utf-8")
alphabet = sorted(set(text))
ids = torch.tensor([alphabet.index(char) for char in text])  # (N,) one id a character
model, losses = train(ids, len(alphabet), steps=200, seed=0)
print(len(losses), round(losses[0], 2), round(sum(losses[-10:]) / 10, 2))  # 200, about 3.5, about 1.8
print(type(model).__name__)  # TinyLM: the model the loop trained

# %% try generate
torch.manual_seed(0)
small = TinyLM(vocab_size=11, d_model=8, num_heads=2, num_layers=2, context=8)
prompt = torch.randint(11, (2, 3))  # (B, T0)
tokens, logits = generate(small, prompt, 5)
print(tokens.shape, logits.shape)  # torch.Size([2, 8]) torch.Size([2, 5, 11])
# Cached = recomputed: the logits of the whole sequence, at the positions before each new token.
print(torch.allclose(logits, small(tokens[:, :-1])[:, 2:], atol=1e-5))  # True

# %% try RoPETransformerBlock
# Optional: leave it as it is and nothing is lost. Written, it should print what the comments say.
torch.manual_seed(0)
rope_block = RoPETransformerBlock(d_model=8, num_heads=2)
x = torch.randn(2, 5, 8)  # (B, T, D), at positions 0 .. 4
y = rope_block(x)
print(y.shape, len(rope_block.state_dict()))  # torch.Size([2, 5, 8]) 12: TransformerBlock's, no more
_, cache = rope_block.forward_with_cache(x[:, :3])  # positions 0 .. 2; the cache holds rotated keys
out, cache = rope_block.forward_with_cache(x[:, 3:], cache)  # rotated at positions 3 and 4
print(torch.allclose(out, y[:, 3:], atol=1e-5), cache[0].shape[2])  # True 5

# %% try sample_next_token
# Optional too. The lesson's example row, drawn 100,000 times: each share should be near its
# probability after the filters (section 6's table), to about a hundredth.
z = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0]).repeat(100_000, 1)  # (B, V)
for options in ({}, {"temperature": 0.5}, {"top_k": 3}, {"top_k": 3, "top_p": 0.8}):
    drawn = sample_next_token(z, **options, seed=0)  # (B,) int64
    print(options, (torch.bincount(drawn, minlength=5) / len(drawn)).tolist())
# {} about [0.563, 0.207, 0.126, 0.076, 0.028]; temperature 0.5 about [0.829, 0.112, 0.041, 0.015, 0.002];
# top_k 3 about [0.629, 0.231, 0.140, 0, 0]; top_k 3 with top_p 0.8 about [0.731, 0.269, 0, 0, 0]
print(torch.equal(sample_next_token(z[:20], seed=1), sample_next_token(z[:20], seed=1)))  # True

# %% plot
from IPython.display import SVG, display

from grader.figures import heatmap_svg


def first_block_weights(model, window, num_heads=2):
    """(H, T, T): what each head of the model's first block attends to over ``window`` (1, T),
    recomputed from the block's own weights as its forward pass does."""
    length = window.shape[1]
    block = model.blocks[0]
    with torch.no_grad():
        x = block.ln1(model.tok_emb(window) + model.pos_emb(torch.arange(length)))  # (1, T, D)
        q, k, _ = block.qkv(x).split(x.shape[-1], dim=-1)  # (1, T, D) each
        q, k = (t[0].view(length, num_heads, -1).transpose(0, 1) for t in (q, k))  # (H, T, d)
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (H, T, T)
        future = torch.ones(length, length, dtype=torch.bool).triu(1)
        return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)


# The model train gave, continuing "the " greedily (the plot cell, as it needs train and
# generate both written):
start = torch.tensor([[alphabet.index(char) for char in "the "]])
new_text, _ = generate(model, start, 28)  # 4 + 28 = 32 positions, the context
print(repr("".join(alphabet[i] for i in new_text[0])))  # 'the to and the the the the token' for seed 0

# The trained model's heads over the first 14 characters of the text. Expect one head to
# have become a previous-token head (chapter 3): its weight sits on the diagonal just below
# the main one. The other spreads over the last few characters. Above the diagonal: the
# causal mask's zeros.
window = ids[None, :14]  # (1, 14)
labels = ["␣" if char == " " else repr(char)[1:-1] for char in text[:14]]  # a space, made visible
for head, weights in enumerate(first_block_weights(model, window)):
    display(SVG(heatmap_svg(weights.tolist(), labels, labels, f"head {head} of block 0, after 200 steps")))
