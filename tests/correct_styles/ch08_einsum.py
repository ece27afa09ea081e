"""Chapter 8 with torch.einsum for every product.

The modules only hold the parameters; forward reads their weights and writes
each contraction with index letters (b batch, t/s positions, h heads, e head
features, d model features, v vocabulary). The causal mask is
torch.tril(torch.ones(T, T)).type_as(x), GELU is written with erf, embeddings
are looked up by indexing the weight, and the training loss is the mean of
-log p(target) taken with log_softmax and gather. One forward serves both
paths: the cache, kept as (b h s e), is read by einsum as it is, the mask is
torch.tril(ones(T, S), diagonal=S - T), and positions are a slice of the
position table.
"""

import math

import torch
from torch import nn


def gelu(u: torch.Tensor) -> torch.Tensor:
    return 0.5 * u * (1.0 + torch.erf(u / math.sqrt(2.0)))  # the exact GELU, as nn.GELU()


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.h = num_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_cache(x)[0]

    def forward_with_cache(self, x: torch.Tensor, cache=None):
        B, T, D = x.shape
        H, E = self.h, D // self.h
        a = self.ln1(x)
        qkv = torch.einsum("btd,fd->btf", a, self.qkv.weight) + self.qkv.bias  # (B, T, 3D)
        q, k, v = qkv.view(B, T, 3, H, E).unbind(dim=2)  # (B, T, H, E) each
        k, v = torch.einsum("bthe->bhte", k), torch.einsum("bthe->bhte", v)  # the cache's layout
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)  # (B, H, S, E)
        S = k.shape[2]
        scores = torch.einsum("bthe,bhse->bhts", q, k) / math.sqrt(E)  # (B, H, T, S)
        keep = torch.tril(torch.ones(T, S), diagonal=S - T).type_as(x)  # (T, S): 1 where s <= S - T + t
        scores = scores.masked_fill(keep == 0, float("-inf"))
        weights = scores.softmax(dim=-1)
        heads = torch.einsum("bhts,bhse->bthe", weights, v).reshape(B, T, D)  # heads side by side
        x = x + torch.einsum("btd,fd->btf", heads, self.proj.weight) + self.proj.bias
        up, down = self.mlp[0], self.mlp[2]
        hidden = gelu(torch.einsum("btd,fd->btf", self.ln2(x), up.weight) + up.bias)  # (B, T, 4D)
        return x + torch.einsum("btf,df->btd", hidden, down.weight) + down.bias, (k, v)


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int, context: int):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList([TransformerBlock(d_model, num_heads) for _ in range(num_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_with_cache(tokens)[0]

    def forward_with_cache(self, tokens: torch.Tensor, cache=None):
        T = tokens.shape[1]
        P = 0 if cache is None else cache[0][0].shape[2]  # positions already cached
        x = self.tok_emb.weight[tokens] + self.pos_emb.weight[P:P + T]  # (B, T, D)
        grown = []
        for i, block in enumerate(self.blocks):
            x, kv = block.forward_with_cache(x, None if cache is None else cache[i])
            grown.append(kv)
        logits = torch.einsum("btd,vd->btv", self.ln_f(x), self.head.weight) + self.head.bias  # (B, T, V)
        return logits, grown


def generate(model, prompt, num_tokens):
    with torch.no_grad():
        logits, cache = model.forward_with_cache(prompt)
        seq, chosen = prompt, []
        for _ in range(num_tokens):
            last = logits[:, -1]  # (B, V)
            nxt = last.argmax(-1)[:, None]  # (B, 1)
            seq, chosen = torch.cat([seq, nxt], 1), chosen + [last]
            logits, cache = model.forward_with_cache(nxt, cache)
    return seq, torch.einsum("nbv->bnv", torch.stack(chosen))


def train(tokens, vocab_size, steps, context=32, batch_size=16, lr=1e-2, seed=0, d_model=32, num_heads=2,
          num_layers=1):
    torch.manual_seed(seed)
    model = TinyLM(vocab_size, d_model, num_heads, num_layers, context).to(tokens.device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    span = torch.arange(context + 1, device=tokens.device)
    history = []
    for _ in range(steps):
        first = torch.randint(high=tokens.shape[0] - context, size=(batch_size,), device=tokens.device)
        idx = first[:, None] + span  # (B, context + 1): start + offset
        seq = tokens[idx]
        x, y = seq[:, :-1], seq[:, 1:]
        logp = model(x).log_softmax(dim=-1)  # (B, T, V)
        loss = -logp.gather(-1, y.unsqueeze(-1)).mean()  # mean over every position of -log p(next)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item())
    return model, history
