"""Chapter 12 written the way DeepSeek's own inference code (DeepSeek-V3's
inference/model.py, class MLA) writes it: RoPE on complex numbers from a
precomputed freqs_cis, heads kept as (B, T, H, d) and scored with einsum, the
"absorb" path that multiplies the query by each head's slice of the
up-projection (viewed as (H, d, c)) and scores it against the cached
latents, and the weighted latents projected by the value slice."""

import math

import torch
from torch import nn


def precompute_freqs_cis(dim, seqlen, base=10000.0, device=None):
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    t = torch.arange(seqlen, device=device, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # (seqlen, dim/2) complex64


def apply_rotary_emb(x, freqs_cis):
    """x (bsz, seqlen, heads, dim); freqs_cis (seqlen, dim/2)."""
    dtype = x.dtype
    x = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, x.size(1), 1, x.size(-1))
    y = torch.view_as_real(x * freqs_cis).flatten(3)
    return y.to(dtype)


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, num_heads, head_dim, rope_dim, kv_rank, q_rank):
        super().__init__()
        self.n_heads = num_heads
        self.qk_nope_head_dim = head_dim
        self.qk_rope_head_dim = rope_dim
        self.v_head_dim = head_dim
        self.kv_lora_rank = kv_rank
        self.softmax_scale = (head_dim + rope_dim) ** -0.5
        self.q_down = nn.Linear(d_model, q_rank, bias=False)
        self.q_up = nn.Linear(q_rank, num_heads * head_dim, bias=False)
        self.q_rope = nn.Linear(q_rank, num_heads * rope_dim, bias=False)
        self.kv_down = nn.Linear(d_model, kv_rank, bias=False)
        self.k_up = nn.Linear(kv_rank, num_heads * head_dim, bias=False)
        self.v_up = nn.Linear(kv_rank, num_heads * head_dim, bias=False)
        self.k_rope = nn.Linear(d_model, rope_dim, bias=False)
        self.out_proj = nn.Linear(num_heads * head_dim, d_model, bias=False)

    def forward(self, x):
        bsz, seqlen, _ = x.size()
        freqs_cis = precompute_freqs_cis(self.qk_rope_head_dim, seqlen, device=x.device)
        q = self.q_down(x)
        q_nope = self.q_up(q).view(bsz, seqlen, self.n_heads, self.qk_nope_head_dim)
        q_pe = apply_rotary_emb(self.q_rope(q).view(bsz, seqlen, self.n_heads, self.qk_rope_head_dim), freqs_cis)
        kv = self.kv_down(x)
        k_pe = apply_rotary_emb(self.k_rope(x).unsqueeze(2), freqs_cis)  # (bsz, seqlen, 1, rope)
        k_nope = self.k_up(kv).view(bsz, seqlen, self.n_heads, self.qk_nope_head_dim)
        v = self.v_up(kv).view(bsz, seqlen, self.n_heads, self.v_head_dim)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, self.n_heads, -1)], dim=-1)
        scores = torch.einsum("bshd,bthd->bsht", q, k) * self.softmax_scale
        mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device).triu_(1)
        scores = scores + mask.unsqueeze(1)
        scores = scores.softmax(dim=-1, dtype=torch.float32).type_as(x)
        out = torch.einsum("bsht,bthd->bshd", scores, v)
        return self.out_proj(out.flatten(2))


def absorbed_decode(module, x, cache=None):
    bsz, seqlen, _ = x.size()
    rope = module.k_rope.weight.size(0)
    n_heads = module.q_rope.weight.size(0) // rope
    nope = module.q_up.weight.size(0) // n_heads
    start_pos = 0 if cache is None else cache[0].size(1)
    end_pos = start_pos + seqlen
    freqs_cis = precompute_freqs_cis(rope, end_pos, device=x.device)[start_pos:end_pos]
    q = module.q_down(x)
    q_nope = module.q_up(q).view(bsz, seqlen, n_heads, nope)
    q_pe = apply_rotary_emb(module.q_rope(q).view(bsz, seqlen, n_heads, rope), freqs_cis)
    kv = module.kv_down(x)
    k_pe = apply_rotary_emb(module.k_rope(x).unsqueeze(2), freqs_cis).squeeze(2)
    kv_cache = kv if cache is None else torch.cat([cache[0], kv], dim=1)
    pe_cache = k_pe if cache is None else torch.cat([cache[1], k_pe], dim=1)
    wkv_b = torch.cat([module.k_up.weight.view(n_heads, nope, -1), module.v_up.weight.view(n_heads, nope, -1)],
                      dim=1)  # (heads, nope + v, rank), as DeepSeek's wkv_b viewed per head
    q_nope = torch.einsum("bshd,hdc->bshc", q_nope, wkv_b[:, :nope])
    scores = (torch.einsum("bshc,btc->bsht", q_nope, kv_cache)
              + torch.einsum("bshr,btr->bsht", q_pe, pe_cache)) / math.sqrt(nope + rope)
    scores = scores.softmax(dim=-1, dtype=torch.float32).type_as(x)
    out = torch.einsum("bsht,btc->bshc", scores, kv_cache)
    out = torch.einsum("bshc,hdc->bshd", out, wkv_b[:, -nope:])
    return module.out_proj(out.flatten(2)), (kv_cache, pe_cache)


def latent_cache_bytes(batch, seq_len, num_layers, num_heads, head_dim, kv_rank, rope_dim, dtype):
    # DeepSeek's kv_cache (max_batch, max_seq, kv_lora_rank) and pe_cache (..., qk_rope_head_dim), per layer
    element = torch.empty((), dtype=dtype).element_size()
    return num_layers * (batch * seq_len * kv_rank + batch * seq_len * rope_dim) * element
