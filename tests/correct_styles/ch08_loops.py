"""Chapter 8 written with explicit Python loops over heads, and PyTorch's attention.

Each head takes its own slice of the fused q, k and v features and runs
F.scaled_dot_product_attention(..., is_causal=True) (allowed in this chapter);
the heads are concatenated back with torch.cat. Training draws each window
of the batch in its own loop iteration and stacks them. With a cache, each new
token has a loop iteration of its own too: it attends, with no mask, to the
keys up to its own position (is_causal=True would align the mask top-left),
and generate is a plain loop that appends one token at a time.
"""

import math

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

    def forward_with_cache(self, x, cache=None):
        d = self.d_model
        hd = d // self.num_heads
        B, T, _ = x.shape
        qkv = self.qkv(self.ln1(x))  # (B, T, 3D)
        q_all, k_all, v_all = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
        past = 0 if cache is None else cache[0].shape[2]
        keys, values, outputs = [], [], []
        for h in range(self.num_heads):
            cols = slice(h * hd, (h + 1) * hd)
            q_h, k_h, v_h = q_all[..., cols], k_all[..., cols], v_all[..., cols]  # (B, T, hd)
            if cache is not None:
                k_h = torch.cat([cache[0][:, h], k_h], dim=1)  # (B, past + T, hd)
                v_h = torch.cat([cache[1][:, h], v_h], dim=1)
            keys.append(k_h)
            values.append(v_h)
            rows = []
            for t in range(T):  # new token t is at position past + t: it sees keys 0 .. past + t
                seen = past + t + 1
                rows.append(F.scaled_dot_product_attention(q_h[:, t:t + 1], k_h[:, :seen], v_h[:, :seen]))
            outputs.append(torch.cat(rows, dim=1))  # (B, T, hd)
        attn = torch.cat(outputs, dim=-1)  # (B, T, D), head 0 first
        x = x + self.proj(attn)
        x = x + self.mlp(self.ln2(x))
        return x, (torch.stack(keys, dim=1), torch.stack(values, dim=1))  # (B, H, past + T, hd) each


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

    def forward_with_cache(self, tokens, cache=None):
        T = tokens.shape[1]
        past = 0 if cache is None else cache[0][0].shape[2]
        pos = torch.arange(past, past + T, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)[None, :, :]
        new_cache = []
        for i in range(len(self.blocks)):
            x, block_cache = self.blocks[i].forward_with_cache(x, None if cache is None else cache[i])
            new_cache.append(block_cache)
        x = self.ln_f(x)
        return self.head(x), new_cache


def generate(model, prompt, num_tokens):
    with torch.no_grad():
        logits, cache = model.forward_with_cache(prompt)
        out = prompt
        all_logits = []
        for i in range(num_tokens):
            step_logits = logits[:, -1, :]  # (B, V)
            best = []
            for b in range(step_logits.shape[0]):
                best.append(int(step_logits[b].argmax()))
            new = torch.tensor(best, device=prompt.device).view(-1, 1)  # (B, 1)
            out = torch.cat([out, new], dim=1)
            all_logits.append(step_logits)
            logits, cache = model.forward_with_cache(new, cache)
    return out, torch.stack(all_logits, dim=1)


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


class RoPETransformerBlock(TransformerBlock):
    """Rotary embeddings by hand: every pair of every token turned with math.cos and math.sin."""

    def __init__(self, d_model, num_heads, theta=10000.0):
        super().__init__(d_model, num_heads)
        self.theta = theta

    def forward(self, x):
        return self.forward_with_cache(x)[0]

    def _rotate(self, u, start):  # (B, T, hd): one head, token t at position start + t
        hd = u.shape[-1]
        out = torch.empty_like(u)
        for t in range(u.shape[1]):
            for k in range(hd // 2):
                angle = (start + t) * self.theta ** (-2 * k / hd)
                c, s = math.cos(angle), math.sin(angle)
                a, b = u[:, t, 2 * k], u[:, t, 2 * k + 1]
                out[:, t, 2 * k] = a * c - b * s
                out[:, t, 2 * k + 1] = a * s + b * c
        return out

    def forward_with_cache(self, x, cache=None):
        d = self.d_model
        hd = d // self.num_heads
        T = x.shape[1]
        qkv = self.qkv(self.ln1(x))
        q_all, k_all, v_all = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
        past = 0 if cache is None else cache[0].shape[2]
        keys, values, outputs = [], [], []
        for h in range(self.num_heads):
            cols = slice(h * hd, (h + 1) * hd)
            q_h = self._rotate(q_all[..., cols], past)
            k_h = self._rotate(k_all[..., cols], past)
            v_h = v_all[..., cols]
            if cache is not None:
                k_h = torch.cat([cache[0][:, h], k_h], dim=1)
                v_h = torch.cat([cache[1][:, h], v_h], dim=1)
            keys.append(k_h)
            values.append(v_h)
            rows = []
            for t in range(T):
                seen = past + t + 1
                rows.append(F.scaled_dot_product_attention(q_h[:, t:t + 1], k_h[:, :seen], v_h[:, :seen]))
            outputs.append(torch.cat(rows, dim=1))
        x = x + self.proj(torch.cat(outputs, dim=-1))
        x = x + self.mlp(self.ln2(x))
        return x, (torch.stack(keys, dim=1), torch.stack(values, dim=1))
