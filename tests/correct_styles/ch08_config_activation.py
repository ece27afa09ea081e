"""Chapter 8 from a config, with the activation chosen by name.

A ``BlockConfig`` dataclass holds the sizes and the name of the MLP's
activation; the MLP's middle layer is a small module that looks the
function up in ``torch.nn.functional`` by that name, ``getattr(F,
activation_name)``, the way model zoos map ``hidden_act`` to a function.
Attention is ``F.scaled_dot_product_attention`` with a boolean causal mask
aligned bottom-right (``tril(T_past)``), which serves the cached path too;
``train`` draws its windows with ``unfold`` and ``generate`` appends each
greedy token with ``torch.cat``.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class BlockConfig:
    d_model: int
    num_heads: int
    mlp_ratio: int = 4
    activation: str = "gelu"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


class Activation(nn.Module):
    """A function of ``torch.nn.functional``, by name: ``Activation("gelu")``."""

    def __init__(self, activation_name: str):
        super().__init__()
        self.activation_name = activation_name
        self.function = getattr(F, activation_name)

    def forward(self, x):
        return self.function(x)

    def extra_repr(self) -> str:
        return self.activation_name


class TransformerBlock(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.config = config = BlockConfig(d_model, num_heads)
        self.ln1 = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.ln2 = nn.LayerNorm(config.d_model)
        hidden = config.mlp_ratio * config.d_model
        self.mlp = nn.Sequential(nn.Linear(config.d_model, hidden), Activation(config.activation),
                                 nn.Linear(hidden, config.d_model))

    def forward(self, x):
        return self.forward_with_cache(x)[0]

    def forward_with_cache(self, x, cache=None):
        batch, length, _ = x.shape
        q, k, v = (t.unflatten(-1, (self.config.num_heads, self.config.head_dim)).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).chunk(3, dim=-1))  # (B, H, T, d) each
        if cache is not None:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)  # (B, H, T_past + T, d)
        past = k.size(2) - length
        visible = torch.ones(length, past + length, dtype=torch.bool, device=x.device).tril(past)
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)  # (B, H, T, d)
        x = x + self.proj(heads.transpose(1, 2).flatten(2))
        return x + self.mlp(self.ln2(x)), (k, v)


class TinyLM(nn.Module):
    def __init__(self, vocab_size, d_model, num_heads, num_layers, context):
        super().__init__()
        self.context = context
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList([TransformerBlock(d_model, num_heads) for _ in range(num_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens):
        return self.forward_with_cache(tokens)[0]

    def forward_with_cache(self, tokens, cache=None):
        past = 0 if cache is None else cache[0][0].size(2)
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(past, past + tokens.size(1), device=tokens.device))
        caches = []
        for index, block in enumerate(self.blocks):
            x, block_cache = block.forward_with_cache(x, None if cache is None else cache[index])
            caches.append(block_cache)
        return self.head(self.ln_f(x)), caches


def train(tokens, vocab_size, steps, context=32, batch_size=16, lr=1e-2, seed=0,
          d_model=32, num_heads=2, num_layers=1):
    torch.manual_seed(seed)
    model = TinyLM(vocab_size, d_model, num_heads, num_layers, context).to(tokens.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    windows = tokens.unfold(0, context + 1, 1)  # (N - context, context + 1): every window, as a view
    losses = []
    for _ in range(steps):
        batch = windows[torch.randint(len(windows), (batch_size,), device=tokens.device)]  # (B, context + 1)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


@torch.no_grad()
def generate(model, prompt, num_tokens):
    logits, cache = model.forward_with_cache(prompt)
    tokens, picked = prompt, []
    for _ in range(num_tokens):
        picked.append(logits[:, -1])
        next_token = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat((tokens, next_token), dim=1)
        logits, cache = model.forward_with_cache(next_token, cache)
    return tokens, torch.stack(picked, dim=1)
