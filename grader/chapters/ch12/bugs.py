"""Known bugs of chapter 12: multi-head latent attention.

Each is a one-line edit of the reference solution (``old`` to ``new``)
with the hint a student reads when their answer matches it; its lesson's
Pitfalls section names it in a ``<!-- known bugs: ... -->`` tag.
"""

from grader.chapters import KnownBug

_SCALE = ("looks like the scores are scaled by 1/sqrt(d_h), a head's content width; the query and key "
          "are [content; rope], d_h + d_R wide, so the scale is 1/sqrt(d_h + d_R)")

BUGS = (
    # -- MultiHeadLatentAttention ------------------------------------------------------------
    KnownBug("MultiHeadLatentAttention", "rope-on-whole-key",
             "looks like RoPE rotates the content keys and queries too, not only the decoupled rope "
             "parts: rotate q_R and k_R alone (a rotated content key could not be absorbed into the "
             "query, which is why MLA decouples them)",
             "k = torch.cat([k_content, k_rot], dim=-1)  # (B, H, T, d_h + d_R)",
             "k = torch.cat([apply_rope(k_content, positions), k_rot], dim=-1)\n"
             "        q = torch.cat([apply_rope(q_content, positions), q_rot], dim=-1)"),
    KnownBug("MultiHeadLatentAttention", "rope-key-per-head",
             "looks like k_rope gives every head its own rope key (D -> H * d_R); MLA's rope key is "
             "one d_R-wide vector a token, shared by every head: k_rope maps D to d_R",
             "self.k_rope = nn.Linear(d_model, rope_dim, bias=False)",
             "self.k_rope = nn.Linear(d_model, num_heads * rope_dim, bias=False)",
             error=r"k_rope\.weight has shape"),
    KnownBug("MultiHeadLatentAttention", "scale-without-rope-dims", _SCALE,
             "math.sqrt(self.head_dim + self.rope_dim)", "math.sqrt(self.head_dim)"),
    KnownBug("MultiHeadLatentAttention", "no-causal-mask",
             "looks like the causal mask is missing: token t may attend to tokens 0 .. t only",
             "scores = scores.masked_fill(future, float(\"-inf\"))", "pass"),
    KnownBug("MultiHeadLatentAttention", "query-not-rotated",
             "looks like the rope query is not rotated: q_R = RoPE(W_QR c_Q), at the query's position, "
             "as the rope key is at the key's",
             "q_rot = apply_rope(q_rot, positions)", "pass"),
    KnownBug("MultiHeadLatentAttention", "values-from-k-up",
             "looks like the values come from k_up: v = v_up(c_KV), the latent up-projected by W_UV",
             "v = self.v_up(c_kv)", "v = self.k_up(c_kv)"),
    # -- absorbed_decode ----------------------------------------------------------------------
    KnownBug("absorbed_decode", "w-uk-transposed",
             "looks like W_UK is absorbed the wrong way round: q_C . (W_UK_h c) = (W_UK_h^T q_C) . c, "
             "so the latent query is q_C @ W_UK_h as rows, with W_UK_h = k_up.weight's rows of head h, "
             "(d_h, d_c)",
             "q_latent = q_content @ w_uk  # (B, H, 1, d_c): W_UK_h^T q_C, as a row",
             "q_latent = q_content @ w_uk.transpose(-2, -1)",
             error=r"batch2 tensor"),
    KnownBug("absorbed_decode", "up-projected-cache",
             "looks like the cache holds the up-projected keys (k_up of the latents), as a multi-head "
             "cache would; MLA caches the latent c_KV itself, (B, T, d_c), and the rope key",
             "return out, (latent, rope_keys)", "return out, (module.k_up(latent), rope_keys)"),
    KnownBug("absorbed_decode", "scale-of-latent-width",
             "looks like the absorbed scores are scaled by 1/sqrt(d_c + d_R), the width of the latent "
             "query and key (F.scaled_dot_product_attention's default): absorbing W_UK changes no score, "
             "so the scale stays 1/sqrt(d_h + d_R)",
             "math.sqrt(head_dim + rope_dim)", "math.sqrt(latent.shape[-1] + rope_dim)"),
    KnownBug("absorbed_decode", "position-off-by-one",
             "looks like the new token is rotated at position T_past + 1; positions count from 0, so "
             "after T_past cached tokens the new one is at position T_past",
             "position = torch.tensor([past], device=x.device)",
             "position = torch.tensor([past + 1], device=x.device)"),
    KnownBug("absorbed_decode", "rope-key-cached-unrotated",
             "looks like the new rope key is cached before its rotation: cache RoPE(W_KR h) at the "
             "token's position, so that no cached key is rotated again",
             "rope_keys = apply_rope(module.k_rope(x), position)",
             "rope_keys = module.k_rope(x)"),
    KnownBug("absorbed_decode", "output-through-w-uk",
             "looks like the weighted latents are up-projected with k_up's weight; the values are "
             "W_UV c, so the head's output is the weighted latent times W_UV_h^T (v_up.weight)",
             "out = context @ w_uv.transpose(-2, -1)", "out = context @ w_uk.transpose(-2, -1)"),
    # -- latent_cache_bytes --------------------------------------------------------------------
    KnownBug("latent_cache_bytes", "rope-key-forgotten",
             "looks like only the latent is counted: every token also caches its rope key, d_R numbers",
             "per_token = kv_rank + rope_dim", "per_token = kv_rank"),
    KnownBug("latent_cache_bytes", "rope-key-per-head",
             "looks like the rope key is counted once per head; it is shared by every head: d_c + d_R "
             "numbers a token, whatever H",
             "per_token = kv_rank + rope_dim", "per_token = kv_rank + num_heads * rope_dim"),
    KnownBug("latent_cache_bytes", "latent-counted-twice",
             "looks like the latent is counted twice, as a key and a value; one latent c_KV gives both "
             "keys and values: d_c + d_R numbers a token",
             "per_token = kv_rank + rope_dim", "per_token = 2 * kv_rank + rope_dim"),
    KnownBug("latent_cache_bytes", "up-projected-keys-and-values",
             "looks like these are multi-head attention's keys and values (2 x H x d_h a token); MLA "
             "caches the latent and the rope key instead: d_c + d_R",
             "per_token = kv_rank + rope_dim", "per_token = 2 * num_heads * head_dim"),
    KnownBug("latent_cache_bytes", "layers-forgotten",
             "looks like one layer is counted: every attention layer keeps its own latent cache",
             "batch * seq_len * num_layers * per_token", "batch * seq_len * per_token"),
    KnownBug("latent_cache_bytes", "bits-not-bytes",
             "looks like the size of a number is counted in bits; the answer is in bytes: "
             "dtype.itemsize (2 for bfloat16)",
             "dtype.itemsize", "torch.finfo(dtype).bits"),
)
