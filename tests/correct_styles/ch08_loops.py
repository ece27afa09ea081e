"""Chapter 8 written with explicit Python loops over heads, and PyTorch's attention.

Each head takes its own slice of the fused q, k and v features and runs
F.scaled_dot_product_attention(..., is_causal=True) (allowed in this chapter);
the heads are concatenated back with torch.cat. Training draws each window
of the batch in its own loop iteration and stacks them.
"""

import torch
from torch import nn
import torch.nn.functional as F


class TransformerBlock(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.d_model = d_model
        self.num_heads = num_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        d = self.d_model
        hd = d // self.num_heads
        qkv = self.qkv(self.ln1(x))  # (B, T, 3D)
        q_all, k_all, v_all = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
        outputs = []
        for h in range(self.num_heads):
            cols = slice(h * hd, (h + 1) * hd)
            q_h, k_h, v_h = q_all[..., cols], k_all[..., cols], v_all[..., cols]  # (B, T, hd)
            outputs.append(F.scaled_dot_product_attention(q_h, k_h, v_h, is_causal=True))  # (B, T, hd)
        attn = torch.cat(outputs, dim=-1)  # (B, T, D), head 0 first
        x = x + self.proj(attn)
        x = x + self.mlp(self.ln2(x))
        return x


class TinyLM(nn.Module):
    def __init__(self, vocab_size, d_model, num_heads, num_layers, context):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        blocks = []
        for _ in range(num_layers):
            blocks.append(TransformerBlock(d_model, num_heads))
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens):
        T = tokens.shape[1]
        pos = torch.arange(T, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)[None, :, :]
        for i in range(len(self.blocks)):
            x = self.blocks[i](x)
        x = self.ln_f(x)
        return self.head(x)


def train(tokens, vocab_size, steps, context=32, batch_size=16, lr=1e-2, seed=0, d_model=32, num_heads=2,
          num_layers=1):
    torch.manual_seed(seed)
    model = TinyLM(vocab_size, d_model, num_heads, num_layers, context)
    model = model.to(tokens.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    n = len(tokens)
    losses = []
    for step in range(steps):
        xs, ys = [], []
        for b in range(batch_size):
            i = int(torch.randint(0, n - context, (1,)))
            xs.append(tokens[i:i + context])
            ys.append(tokens[i + 1:i + context + 1])
        xb, yb = torch.stack(xs), torch.stack(ys)  # (B, T) each
        logits = model(xb)
        loss = F.cross_entropy(logits.flatten(0, 1), yb.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return model, losses
