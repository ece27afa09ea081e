"""Chapter 8 in the style of Harvard NLP's "The Annotated Transformer".

A free-standing `attention(query, key, value, mask)` that fills masked scores
with -1e9, `subsequent_mask(size)` made on the CPU and moved with
`.type_as(x)`, `clones` for the stack of layers followed by Xavier
initialisation of every matrix (as make_model does), a hand-written LayerNorm
(with the parameter names nn.LayerNorm has, and its biased variance), a Batch
object holding src / tgt_y / ntokens, and a summed loss divided by the number
of tokens. With a cache, the mask is the last rows of subsequent_mask(past +
T), and generate is the tutorial's greedy_decode (torch.max over the logits of
the last position, ys grown with torch.cat) fed one word at a time.
"""

import copy
import math

import torch
import torch.nn as nn


def clones(module, N):
    "Produce N identical layers."
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


def subsequent_mask(size):
    "Mask out subsequent positions."
    attn_shape = (1, size, size)
    subsequent_mask = torch.triu(torch.ones(attn_shape), diagonal=1).type(torch.uint8)
    return subsequent_mask == 0


def attention(query, key, value, mask=None):
    "Compute 'Scaled Dot Product Attention'"
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    return torch.matmul(p_attn, value), p_attn


class LayerNorm(nn.Module):
    "Construct a layernorm module (normalises over the last dimension, biased variance)."

    def __init__(self, features, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias


class TransformerBlock(nn.Module):
    "Pre-norm decoder layer: self-attn and feed forward, each in a residual connection."

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0
        # We assume d_v always equals d_k
        self.d_k = d_model // num_heads
        self.h = num_heads
        self.size = d_model
        self.ln1 = LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.attn = None

    def self_attn(self, x, mask, layer_cache=None):
        nbatches = x.size(0)
        # Same mask applied to all h heads.
        mask = mask.unsqueeze(1)
        # 1) Do all the linear projections in batch from d_model => h x d_k
        query, key, value = [
            lin.view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
            for lin in self.qkv(x).chunk(3, dim=-1)
        ]
        # The earlier words' keys and values come first.
        if layer_cache is not None:
            key = torch.cat([layer_cache[0], key], dim=2)
            value = torch.cat([layer_cache[1], value], dim=2)
        # 2) Apply attention on all the projected vectors in batch.
        x, self.attn = attention(query, key, value, mask=mask)
        # 3) "Concat" using a view and apply a final linear.
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        del query
        return self.proj(x), (key, value)

    def forward(self, x):
        mask = subsequent_mask(x.size(1)).type_as(x)
        x = x + self.self_attn(self.ln1(x), mask)[0]
        return x + self.mlp(self.ln2(x))

    def forward_with_cache(self, x, layer_cache=None):
        past = 0 if layer_cache is None else layer_cache[0].size(2)
        # The rows of the new words in the mask of the whole sequence.
        mask = subsequent_mask(past + x.size(1))[:, past:].type_as(x)
        attended, layer_cache = self.self_attn(self.ln1(x), mask, layer_cache)
        x = x + attended
        return x + self.mlp(self.ln2(x)), layer_cache


class TinyLM(nn.Module):
    "A decoder-only model: embeddings, N pre-norm layers, a final norm, a generator."

    def __init__(self, vocab_size, d_model, num_heads, num_layers, context):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = clones(TransformerBlock(d_model, num_heads), num_layers)
        self.ln_f = LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)
        # This was important from their code.
        # Initialize parameters with Glorot / fan_avg.
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, src):
        positions = torch.arange(0, src.size(1)).type_as(src)
        x = self.tok_emb(src) + self.pos_emb(positions)
        for layer in self.blocks:
            x = layer(x)
        return self.head(self.ln_f(x))

    def forward_with_cache(self, src, cache=None):
        start = 0 if cache is None else cache[0][0].size(2)
        positions = torch.arange(start, start + src.size(1)).type_as(src)
        x = self.tok_emb(src) + self.pos_emb(positions)
        new_cache = []
        for i, layer in enumerate(self.blocks):
            x, layer_cache = layer.forward_with_cache(x, None if cache is None else cache[i])
            new_cache.append(layer_cache)
        return self.head(self.ln_f(x)), new_cache


def generate(model, src, max_len):
    "Greedy decoding, one word at a time through the cache."
    with torch.no_grad():
        out, cache = model.forward_with_cache(src)
        ys = src
        scores = []
        for i in range(max_len):
            prob = out[:, -1]
            _, next_word = torch.max(prob, dim=1)
            ys = torch.cat([ys, next_word.unsqueeze(1)], dim=1)
            scores.append(prob)
            out, cache = model.forward_with_cache(next_word.unsqueeze(1), cache)
    return ys, torch.stack(scores, dim=1)


class Batch:
    "Object for holding a batch of data during training."

    def __init__(self, windows):
        self.src = windows[:, :-1]
        self.tgt_y = windows[:, 1:]
        self.ntokens = self.tgt_y.numel()


def train(tokens, vocab_size, steps, context=32, batch_size=16, lr=1e-2, seed=0, d_model=32, num_heads=2,
          num_layers=1):
    torch.manual_seed(seed)
    model = TinyLM(vocab_size, d_model, num_heads, num_layers, context).to(tokens.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    criterion = nn.CrossEntropyLoss(reduction="sum")
    all_windows = tokens.unfold(0, context + 1, 1)  # (N - context, context + 1), a view
    losses = []
    for i in range(steps):
        idx = torch.randint(all_windows.size(0), (batch_size,), device=tokens.device)
        batch = Batch(all_windows[idx])
        out = model(batch.src)
        loss = criterion(out.contiguous().view(-1, out.size(-1)), batch.tgt_y.contiguous().view(-1)) / batch.ntokens
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses
