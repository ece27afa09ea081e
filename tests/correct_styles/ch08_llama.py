"""Chapter 8 in the style of Meta's reference Llama model.py.

The model builds one additive mask per forward (torch.full of -inf, torch.triu
with diagonal=1, .type_as(h)) and hands it to every layer; a layer called on its
own builds the same mask. Scores are softmaxed in float32,
`F.softmax(scores.float(), dim=-1).type_as(xq)`. Training builds the model under
`with torch.device(...)` and takes the loss as
`F.cross_entropy(input=logits.transpose(1, 2), target=...)`. With a cache the
layers take `start_pos` and the mask is llama's
`torch.hstack([torch.zeros((seqlen, start_pos)), mask])`, none for a single
token; generate is llama's: a `tokens` tensor filled with a pad id up to
total_len, `prev_pos` and `cur_pos`, `torch.argmax(logits[:, -1], dim=-1)` and
`next_token.reshape(-1)` written into `tokens[:, cur_pos]`.
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def causal_additive_mask(seqlen: int, like: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
    mask = torch.full((seqlen, seqlen), float("-inf"), device=like.device)
    mask = torch.triu(mask, diagonal=1)
    # When performing key-value caching, we compute the attention scores
    # only for the new sequence. Thus, the matrix of scores is of size
    # (seqlen, cache_len + seqlen), and the only masked entries are (i, j) for
    # j > cache_len + i, since row i corresponds to token cache_len + i.
    mask = torch.hstack([torch.zeros((seqlen, start_pos), device=like.device), mask])
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

    def attention(self, x: torch.Tensor, mask: Optional[torch.Tensor], cache=None):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.qkv(x).chunk(3, dim=-1)

        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_heads, self.head_dim)

        xq = xq.transpose(1, 2)  # (bs, n_heads, seqlen, head_dim)
        keys = xk.transpose(1, 2)
        values = xv.transpose(1, 2)
        if cache is not None:
            keys = torch.cat([cache[0], keys], dim=2)  # (bs, n_heads, cache_len + seqlen, head_dim)
            values = torch.cat([cache[1], values], dim=2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask  # (bs, n_heads, seqlen, cache_len + seqlen)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)  # (bs, n_heads, seqlen, head_dim)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.proj(output), (keys, values)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if mask is None:
            mask = causal_additive_mask(x.shape[1], x)
        h = x + self.attention(self.ln1(x), mask)[0]
        out = h + self.mlp(self.ln2(h))
        return out

    def forward_with_cache(self, x: torch.Tensor, cache=None, mask: Optional[torch.Tensor] = None):
        start_pos = 0 if cache is None else cache[0].shape[2]
        if mask is None and x.shape[1] > 1:
            mask = causal_additive_mask(x.shape[1], x, start_pos)
        attended, cache = self.attention(self.ln1(x), mask, cache)
        h = x + attended
        out = h + self.mlp(self.ln2(h))
        return out, cache


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

    def forward_with_cache(self, tokens: torch.Tensor, caches=None):
        _bsz, seqlen = tokens.shape
        start_pos = 0 if caches is None else caches[0][0].shape[2]
        h = self.tok_emb(tokens)
        h = h + self.pos_emb.weight[start_pos:start_pos + seqlen]

        mask = None
        if seqlen > 1:
            mask = causal_additive_mask(seqlen, h, start_pos)

        new_caches = []
        for i, layer in enumerate(self.blocks):
            h, cache = layer.forward_with_cache(h, None if caches is None else caches[i], mask)
            new_caches.append(cache)
        h = self.ln_f(h)
        output = self.head(h).float()
        return output.type_as(h), new_caches


@torch.inference_mode()
def generate(model: TinyLM, prompt_tokens: torch.Tensor, max_gen_len: int):
    bsz, prompt_len = prompt_tokens.shape
    total_len = prompt_len + max_gen_len
    pad_id = -1
    tokens = torch.full((bsz, total_len), pad_id, dtype=torch.long, device=prompt_tokens.device)
    tokens[:, :prompt_len] = prompt_tokens
    all_logits = []
    prev_pos, caches = 0, None
    for cur_pos in range(prompt_len, total_len):
        logits, caches = model.forward_with_cache(tokens[:, prev_pos:cur_pos], caches)
        all_logits.append(logits[:, -1])
        next_token = torch.argmax(logits[:, -1], dim=-1)
        next_token = next_token.reshape(-1)
        tokens[:, cur_pos] = next_token
        prev_pos = cur_pos
    return tokens, torch.stack(all_logits, dim=1)


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


# Meta's llama: the pairs as complex numbers, turned by freqs_cis from start_pos on; the
# keys are rotated before they join the cache.
def precompute_freqs_cis(dim: int, start: int, end: int, theta: float, device) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device)[: (dim // 2)].float() / dim))
    t = torch.arange(start, end, device=device, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])  # (1, seqlen, 1, head_dim / 2)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class RoPETransformerBlock(TransformerBlock):
    def __init__(self, d_model: int, num_heads: int, theta: float = 10000.0):
        super().__init__(d_model, num_heads)
        self.theta = theta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_cache(x)[0]

    def attention(self, x: torch.Tensor, mask: Optional[torch.Tensor], cache=None):
        bsz, seqlen, _ = x.shape
        start_pos = 0 if cache is None else cache[0].shape[2]
        xq, xk, xv = self.qkv(x).chunk(3, dim=-1)
        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_heads, self.head_dim)
        freqs_cis = precompute_freqs_cis(self.head_dim, start_pos, start_pos + seqlen, self.theta, x.device)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)

        xq, keys, values = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        if cache is not None:
            keys = torch.cat([cache[0], keys], dim=2)
            values = torch.cat([cache[1], values], dim=2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.proj(output), (keys, values)


def sample_top_p(probs, p, generator):
    """Meta llama's nucleus sampling: sort descending, zero the tokens once the mass before
    them exceeds p, renormalize, draw among the sorted ones and map back."""
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    mask = probs_sum - probs_sort >= p
    probs_sort[mask] = 0.0
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    next_token = torch.multinomial(probs_sort, num_samples=1, generator=generator)
    return torch.gather(probs_idx, -1, next_token)


def sample_next_token(logits: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                      top_p: Optional[float] = None, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator(device=logits.device).manual_seed(seed)
    logits = logits / temperature
    if top_k is not None:
        values, _ = torch.topk(logits, top_k)
        logits = torch.where(logits < values[:, -1:], torch.full_like(logits, float("-inf")), logits)
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None:
        return sample_top_p(probs, top_p, generator).reshape(-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).reshape(-1)
