"""Chapter 12 written the way Hugging Face's DeepseekV2Attention writes it,
and the decode as multi-query attention over the latent cache. The forward fuses the
down-projection and the rope key into one ``kv_a_proj_with_mqa`` (the two
weights concatenated), splits it, reorders the rope features from pairs to
halves and rotates with ``rotate_half`` (HF's port, whose scores are those
of adjacent pairs), and calls ``F.scaled_dot_product_attention`` with the
scale given. The decode is multi-query attention over one shared key head
``[c_KV; k_R]`` (d_c + d_R wide) whose value head is ``c_KV``, the heads'
absorbed queries as the query heads (``enable_gqa``)."""

import torch
import torch.nn.functional as F
from torch import nn


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary_cos_sin(dim, position_ids, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device=position_ids.device).float() / dim))
    freqs = torch.outer(position_ids.float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary_pos_emb(q, cos, sin):
    """q (b, h, s, d) in pairs (2k, 2k+1): reordered to halves as DeepSeek-V2's HF port does, rotated."""
    b, h, s, d = q.shape
    q = q.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    return (q * cos.to(q.dtype)) + (rotate_half(q) * sin.to(q.dtype))


def to_pairs(x):
    """Undo the reordering: halves back to adjacent pairs."""
    b, h, s, d = x.shape
    return x.view(b, h, s, 2, d // 2).transpose(4, 3).reshape(b, h, s, d)


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, num_heads, head_dim, rope_dim, kv_rank, q_rank):
        super().__init__()
        self.num_heads = num_heads
        self.qk_nope_head_dim = head_dim
        self.qk_rope_head_dim = rope_dim
        self.q_head_dim = head_dim + rope_dim
        self.kv_lora_rank = kv_rank
        self.q_down = nn.Linear(d_model, q_rank, bias=False)
        self.q_up = nn.Linear(q_rank, num_heads * head_dim, bias=False)
        self.q_rope = nn.Linear(q_rank, num_heads * rope_dim, bias=False)
        self.kv_down = nn.Linear(d_model, kv_rank, bias=False)
        self.k_up = nn.Linear(kv_rank, num_heads * head_dim, bias=False)
        self.v_up = nn.Linear(kv_rank, num_heads * head_dim, bias=False)
        self.k_rope = nn.Linear(d_model, rope_dim, bias=False)
        self.out_proj = nn.Linear(num_heads * head_dim, d_model, bias=False)

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.size()
        position_ids = torch.arange(q_len, device=hidden_states.device)
        cos, sin = rotary_cos_sin(self.qk_rope_head_dim, position_ids)
        q_a = self.q_down(hidden_states)
        q_nope = self.q_up(q_a).view(bsz, q_len, self.num_heads, -1).transpose(1, 2)
        q_pe = self.q_rope(q_a).view(bsz, q_len, self.num_heads, -1).transpose(1, 2)
        kv_a_proj_with_mqa = torch.cat([self.kv_down.weight, self.k_rope.weight], dim=0)
        compressed_kv = F.linear(hidden_states, kv_a_proj_with_mqa)
        compressed_kv, k_pe = torch.split(compressed_kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe = k_pe.view(bsz, q_len, 1, self.qk_rope_head_dim).transpose(1, 2)
        k_nope = self.k_up(compressed_kv).view(bsz, q_len, self.num_heads, -1).transpose(1, 2)
        value_states = self.v_up(compressed_kv).view(bsz, q_len, self.num_heads, -1).transpose(1, 2)
        q_pe = apply_rotary_pos_emb(q_pe, cos, sin)
        k_pe = apply_rotary_pos_emb(k_pe, cos, sin)
        query_states = k_pe.new_empty(bsz, self.num_heads, q_len, self.q_head_dim)
        query_states[:, :, :, : self.qk_nope_head_dim] = q_nope
        query_states[:, :, :, self.qk_nope_head_dim:] = q_pe
        key_states = k_pe.new_empty(bsz, self.num_heads, q_len, self.q_head_dim)
        key_states[:, :, :, : self.qk_nope_head_dim] = k_nope
        key_states[:, :, :, self.qk_nope_head_dim:] = k_pe
        attn_output = F.scaled_dot_product_attention(query_states, key_states, value_states, is_causal=True,
                                                     scale=self.q_head_dim ** -0.5)
        attn_output = attn_output.transpose(1, 2).reshape(bsz, q_len, -1)
        return self.out_proj(attn_output)


def absorbed_decode(module, x, cache=None):
    bsz = x.shape[0]
    rope_dim = module.k_rope.out_features
    num_heads = module.q_rope.out_features // rope_dim
    head_dim = module.q_up.out_features // num_heads
    past = 0 if cache is None else cache[0].shape[1]
    cos, sin = rotary_cos_sin(rope_dim, torch.arange(past, past + 1, device=x.device))
    q_a = module.q_down(x)
    q_nope = module.q_up(q_a).view(bsz, 1, num_heads, head_dim).transpose(1, 2)  # (b, h, 1, d)
    q_pe = to_pairs(apply_rotary_pos_emb(module.q_rope(q_a).view(bsz, 1, num_heads, rope_dim).transpose(1, 2),
                                         cos, sin))
    k_pe = to_pairs(apply_rotary_pos_emb(module.k_rope(x).unsqueeze(1), cos, sin))[:, 0]  # (b, 1, r)
    latent = module.kv_down(x)
    if cache is not None:
        latent = torch.cat([cache[0], latent], dim=1)
        k_pe = torch.cat([cache[1], k_pe], dim=1)
    w_kc = module.k_up.weight.unflatten(0, (num_heads, head_dim))  # (h, d, c)
    w_vc = module.v_up.weight.unflatten(0, (num_heads, head_dim))
    q_latent = torch.einsum("bhsd,hdc->bhsc", q_nope, w_kc)
    query = torch.cat([q_latent, q_pe], dim=-1)  # (b, h, 1, c + r)
    key = torch.cat([latent, k_pe], dim=-1).unsqueeze(1)  # (b, 1, t, c + r): one key head
    context = F.scaled_dot_product_attention(query, key, latent.unsqueeze(1), enable_gqa=True,
                                             scale=(head_dim + rope_dim) ** -0.5)  # (b, h, 1, c)
    out = torch.einsum("bhsc,hdc->bshd", context, w_vc).reshape(bsz, 1, -1)
    return module.out_proj(out), (latent, k_pe)


def latent_cache_bytes(batch, seq_len, num_layers, num_heads, head_dim, kv_rank, rope_dim, dtype):
    # The one key head of the decode above: kv_lora_rank + qk_rope_head_dim numbers a token.
    kv_head_width = kv_rank + rope_dim
    return num_layers * batch * seq_len * kv_head_width * (torch.finfo(dtype).bits // 8
                                                           if dtype.is_floating_point else torch.iinfo(dtype).bits // 8)
