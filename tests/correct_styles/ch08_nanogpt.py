"""Chapter 8 written the way nanoGPT's model.py and train.py read.

One fused c_attn-like Linear (here `qkv`) split into q, k, v; the causal mask is a
registered lower-triangular buffer `bias` of shape (1, 1, n, n), sliced to
[:, :, :T, :T] and used with masked_fill(... == 0, -inf); GPT-2's initialisation
(normal(0, 0.02), zero biases, residual projections scaled by 1/sqrt(2 n_layer));
and a get_batch that stacks random windows, with zero_grad(set_to_none=True).
With a cache, the new queries take the rows past .. past + T of the same
buffer, [:, :, past:past + T, :past + T]; generate is nanoGPT's
@torch.no_grad() loop with idx_next appended by torch.cat, greedy (top-1 of
torch.topk) and fed alone once the prompt is in the cache.
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

    def attn(self, x, kv_cache=None):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)
        past = 0 if kv_cache is None else kv_cache[0].size(2)
        if past + T > self.bias.size(-1):  # longer than the mask: make a bigger one
            self.bias = torch.tril(torch.ones(past + T, past + T, device=x.device)).view(1, 1, past + T, past + T)

        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        q, k, v = self.qkv(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        if kv_cache is not None:
            k = torch.cat((kv_cache[0], k), dim=2)  # (B, nh, past + T, hs)
            v = torch.cat((kv_cache[1], v), dim=2)

        # causal self-attention; Self-attend: (B, nh, T, hs) x (B, nh, hs, past + T) -> (B, nh, T, past + T)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, past:past + T, :past + T] == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, nh, T, past + T) x (B, nh, past + T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side

        # output projection
        return self.proj(y), (k, v)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))[0]
        x = x + self.mlp(self.ln2(x))
        return x

    def forward_with_cache(self, x, kv_cache=None):
        y, kv_cache = self.attn(self.ln1(x), kv_cache)
        x = x + y
        x = x + self.mlp(self.ln2(x))
        return x, kv_cache


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

    def forward_with_cache(self, idx, kv_caches=None):
        device = idx.device
        b, t = idx.size()
        past = 0 if kv_caches is None else kv_caches[0][0].size(2)
        assert past + t <= self.block_size, f"Cannot forward to position {past + t}, block size is only {self.block_size}"
        pos = torch.arange(past, past + t, dtype=torch.long, device=device)  # shape (t)

        x = self.tok_emb(idx) + self.pos_emb(pos)
        new_caches = []
        for i, block in enumerate(self.blocks):
            x, kv = block.forward_with_cache(x, None if kv_caches is None else kv_caches[i])
            new_caches.append(kv)
        x = self.ln_f(x)
        return self.head(x), new_caches

    @torch.no_grad()
    def generate(self, idx, max_new_tokens):
        """Take a conditioning sequence of indices idx (LongTensor of shape (b,t)) and complete
        the sequence max_new_tokens times, greedily, feeding the predictions back into the model
        one at a time through the KV cache."""
        logits, kv_caches = self.forward_with_cache(idx)
        picked = []
        for _ in range(max_new_tokens):
            # pluck the logits at the final step
            logits = logits[:, -1, :]
            picked.append(logits)
            # greedy: the top-1 of the distribution
            _, idx_next = torch.topk(logits, k=1, dim=-1)
            # append sampled index to the running sequence and continue
            idx = torch.cat((idx, idx_next), dim=1)
            logits, kv_caches = self.forward_with_cache(idx_next, kv_caches)
        return idx, torch.stack(picked, dim=1)


def generate(model, idx, max_new_tokens):
    return model.generate(idx, max_new_tokens)


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


def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, seed=0):
    # nanoGPT's generate: scale by the temperature, crop to the top k, sample from the softmax;
    # the nucleus filter added in the same in-place style.
    logits = logits / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float('Inf')
    if top_p is not None:
        probs = F.softmax(logits, dim=-1)
        sorted_probs, idx = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # the mass ranked above each
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, idx, before >= top_p)
        logits[drop] = -float('Inf')
    probs = F.softmax(logits, dim=-1)
    g = torch.Generator(device=logits.device)
    g.manual_seed(seed)
    idx_next = torch.multinomial(probs, num_samples=1, generator=g)
    return idx_next.view(-1)
