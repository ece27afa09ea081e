"""Chapter 8 written the way nanoGPT's model.py and train.py read.

One fused c_attn-like Linear (here `qkv`) split into q, k, v; the causal mask is a
registered lower-triangular buffer `bias` of shape (1, 1, n, n), sliced to
[:, :, :T, :T] and used with masked_fill(... == 0, -inf); GPT-2's initialisation
(normal(0, 0.02), zero biases, residual projections scaled by 1/sqrt(2 n_layer));
and a get_batch that stacks random windows, with zero_grad(set_to_none=True).
"""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

BLOCK_SIZE = 1024  # GPT-2's n_positions: the size of the registered causal mask


class TransformerBlock(nn.Module):

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0
        self.ln1 = nn.LayerNorm(d_model)
        # key, query, value projections for all heads, but in a batch
        self.qkv = nn.Linear(d_model, 3 * d_model)
        # output projection
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model),
            nn.GELU(),
            nn.Linear(4 * d_model, d_model),
        )
        self.n_head = num_heads
        self.n_embd = d_model
        # causal mask to ensure that attention is only applied to the left in the input sequence
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK_SIZE, BLOCK_SIZE))
                             .view(1, 1, BLOCK_SIZE, BLOCK_SIZE))

    def attn(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)
        if T > self.bias.size(-1):  # longer than the mask: make a bigger one
            self.bias = torch.tril(torch.ones(T, T, device=x.device)).view(1, 1, T, T)

        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        q, k, v = self.qkv(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

        # causal self-attention; Self-attend: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side

        # output projection
        return self.proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class TinyLM(nn.Module):

    def __init__(self, vocab_size, d_model, num_heads, num_layers, context):
        super().__init__()
        self.block_size = context
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList([TransformerBlock(d_model, num_heads) for _ in range(num_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

        # init all weights
        self.apply(self._init_weights)
        # apply special scaled init to the residual projections, per GPT-2 paper
        for pn, p in self.named_parameters():
            if pn.endswith('proj.weight') or pn.endswith('mlp.2.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * num_layers))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        device = idx.device
        b, t = idx.size()
        assert t <= self.block_size, f"Cannot forward sequence of length {t}, block size is only {self.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=device)  # shape (t)

        # forward the GPT model itself
        tok_emb = self.tok_emb(idx)  # token embeddings of shape (b, t, n_embd)
        pos_emb = self.pos_emb(pos)  # position embeddings of shape (t, n_embd)
        x = tok_emb + pos_emb
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return self.head(x)  # (b, t, vocab_size)


def train(tokens, vocab_size, steps, context=32, batch_size=16, lr=1e-2, seed=0,
          d_model=32, num_heads=2, num_layers=1):
    torch.manual_seed(seed)
    device = tokens.device
    data = tokens
    block_size = context

    def get_batch():
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([data[i:i + block_size] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    model = TinyLM(vocab_size, d_model, num_heads, num_layers, context)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    model.train()
    lossi = []
    for iter_num in range(steps):
        X, Y = get_batch()
        logits = model(X)
        B, T, C = logits.shape
        loss = F.cross_entropy(logits.view(B * T, C), Y.view(B * T))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        lossi.append(loss.item())
    return model, lossi
