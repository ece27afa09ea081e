"""Chapter 8 in the style of Meta's reference Llama model.py.

The model builds one additive mask per forward (torch.full of -inf, torch.triu
with diagonal=1, .type_as(h)) and hands it to every layer; a layer called on its
own builds the same mask. Scores are softmaxed in float32,
`F.softmax(scores.float(), dim=-1).type_as(xq)`. Training builds the model under
`with torch.device(...)` and takes the loss as
`F.cross_entropy(input=logits.transpose(1, 2), target=...)`.
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def causal_additive_mask(seqlen: int, like: torch.Tensor) -> torch.Tensor:
    mask = torch.full((seqlen, seqlen), float("-inf"), device=like.device)
    mask = torch.triu(mask, diagonal=1)
    return mask.type_as(like)


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.n_heads = num_heads
        self.dim = d_model
        self.head_dim = d_model // num_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def attention(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.qkv(x).chunk(3, dim=-1)

        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_heads, self.head_dim)

        xq = xq.transpose(1, 2)  # (bs, n_heads, seqlen, head_dim)
        keys = xk.transpose(1, 2)
        values = xv.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask  # (bs, n_heads, seqlen, seqlen)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)  # (bs, n_heads, seqlen, head_dim)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.proj(output)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if mask is None:
            mask = causal_additive_mask(x.shape[1], x)
        h = x + self.attention(self.ln1(x), mask)
        out = h + self.mlp(self.ln2(h))
        return out


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int, context: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.n_layers = num_layers
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = torch.nn.ModuleList()
        for _ in range(num_layers):
            self.blocks.append(TransformerBlock(d_model, num_heads))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _bsz, seqlen = tokens.shape
        h = self.tok_emb(tokens)
        h = h + self.pos_emb.weight[:seqlen]

        mask = None
        if seqlen > 1:
            mask = causal_additive_mask(seqlen, h)

        for layer in self.blocks:
            h = layer(h, mask)
        h = self.ln_f(h)
        output = self.head(h).float()
        return output.type_as(h)


def train(tokens: torch.Tensor, vocab_size: int, steps: int, context: int = 32, batch_size: int = 16,
          lr: float = 1e-2, seed: int = 0, d_model: int = 32, num_heads: int = 2, num_layers: int = 1):
    torch.manual_seed(seed)
    with torch.device(tokens.device):
        model = TinyLM(vocab_size, d_model, num_heads, num_layers, context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    window = torch.arange(context + 1, device=tokens.device)
    losses: list[float] = []
    for _ in range(steps):
        start = torch.randint(0, tokens.numel() - context, (batch_size,), device=tokens.device)
        chunk = tokens[start[:, None] + window]  # (bsz, context + 1)
        inputs, targets = chunk[:, :-1], chunk[:, 1:]
        logits = model(inputs)  # (bsz, seqlen, vocab)
        loss = F.cross_entropy(input=logits.transpose(1, 2), target=targets, reduction="mean")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses
