"""Known bugs of chapter 4: causal masks, causal self-attention, the KV cache."""

from grader.chapters import KnownBug

_TOP_LEFT = ("looks like the causal mask is aligned top-left, as is_causal=True in "
             "F.scaled_dot_product_attention (query i sees keys 0..i); here the L queries "
             "are the last L of the S tokens, so query i sees keys 0..i + S - L (bottom-right)")
_ON_THE_CPU = ("looks like the mask is built on the CPU (no device=): on a GPU the scores are "
               "there and masked_fill fails; build it on the scores' device")
_GPU_FAILURE = r"would (fail on|return a tensor on the CPU when run on) a GPU"
_DIAGONAL_BLOCKED = ("looks like the causal mask blocks the diagonal too (triu(..., diagonal=0), or "
                     "j < i): a token must see itself, so block only the keys after it; "
                     "causal_mask gives the right one")
_SCALE_BY_D_MODEL = ("looks like the scores are divided by sqrt(d_model) instead of sqrt(d), "
                     "the width of one head (D // H)")

BUGS = (
    # -- causal_mask ---------------------------------------------------------------------
    KnownBug("causal_mask", "diagonal-blocked",
             "looks like the diagonal is blocked too (triu(..., diagonal=0)): a token must see "
             "itself, so block only the keys after it (triu(..., diagonal=1) when L == S)",
             "diagonal=num_keys - num_queries + 1", "diagonal=num_keys - num_queries"),
    KnownBug("causal_mask", "top-left", _TOP_LEFT,
             "diagonal=num_keys - num_queries + 1", "diagonal=1"),
    KnownBug("causal_mask", "offset-sign",
             "looks like the offset has the wrong sign: query i sits at position i + S - L, "
             "so the first key it may not see is i + S - L + 1",
             "diagonal=num_keys - num_queries + 1", "diagonal=num_queries - num_keys + 1"),
    KnownBug("causal_mask", "inverted",
             "looks like the mask is inverted: True must mark the keys a query may attend to "
             "(itself and the past), False the future ones",
             "return ~blocked", "return blocked"),
    KnownBug("causal_mask", "device-ignored",
             "looks like the device argument is ignored: the mask must be created on it "
             "(torch.ones(..., device=device)), or it lands on the CPU while the scores are on the GPU",
             "dtype=torch.bool, device=device)", "dtype=torch.bool)", error=_GPU_FAILURE),
    # -- causal_self_attention -------------------------------------------------------------
    KnownBug("causal_self_attention", "no-causal-mask",
             "looks like there is no causal mask: every token also attends to the tokens after "
             "it; combine causal_mask(T) with the padding mask",
             "mask = causal_mask(length, device=x.device)",
             "mask = torch.ones(length, length, dtype=torch.bool, device=x.device)"),
    # The mask written in place instead of with causal_mask.
    KnownBug("causal_self_attention", "diagonal-blocked", _DIAGONAL_BLOCKED,
             "mask = causal_mask(length, device=x.device)",
             "mask = ~torch.ones(length, length, dtype=torch.bool, device=x.device).triu(diagonal=0)"),
    KnownBug("causal_self_attention", "mask-inverted",
             "looks like the mask is inverted: masked_fill(mask, -inf) removes the keys a token "
             "may see; fill where the mask is False (~mask)",
             "scores.masked_fill(~mask,", "scores.masked_fill(mask,"),
    KnownBug("causal_self_attention", "finite-fill",
             "looks like masked scores are filled with a finite number such as -1e9 instead of "
             "-inf: -1e9 does not fit in float16 (its largest value is 65504), and a sequence "
             "of length 0 then averages its padding instead of giving zeros",
             'scores = scores.masked_fill(~mask, float("-inf"))',
             "scores = scores.masked_fill(~mask, -1e9)",
             error=r"cannot be converted to type \S*Half without overflow"),
    KnownBug("causal_self_attention", "padding-on-queries",
             "looks like the padding mask hides padded queries (rows) instead of padded keys "
             "(columns): it must broadcast as (B, 1, 1, T) against the scores (B, H, T, T)",
             "keys[:, None, None, :]", "keys[:, None, :, None]"),
    KnownBug("causal_self_attention", "mask-on-cpu", _ON_THE_CPU,
             "mask = causal_mask(length, device=x.device)", "mask = causal_mask(length)",
             error=_GPU_FAILURE),
    KnownBug("causal_self_attention", "scale-by-d-model", _SCALE_BY_D_MODEL,
             "/ math.sqrt(q.shape[-1])", "/ math.sqrt(x.shape[-1])"),
    # -- attend_with_cache -----------------------------------------------------------------
    KnownBug("attend_with_cache", "top-left", _TOP_LEFT,
             "mask = causal_mask(length, k.shape[-2], device=x_new.device)",
             "mask = torch.ones(length, k.shape[-2], dtype=torch.bool, device=x_new.device).tril()"),
    KnownBug("attend_with_cache", "square-mask",
             "looks like the mask is (T_new, T_new): with a cache the scores are "
             "(T_new, T_past + T_new), so build causal_mask(T_new, T_past + T_new)",
             "mask = causal_mask(length, k.shape[-2], device=x_new.device)",
             "mask = causal_mask(length, device=x_new.device)",
             error=r"size of tensor a \(\d+\) must match the size of tensor b \(\d+\)"),
    KnownBug("attend_with_cache", "diagonal-blocked", _DIAGONAL_BLOCKED,
             "mask = causal_mask(length, k.shape[-2], device=x_new.device)",
             "mask = ~torch.ones(length, k.shape[-2], dtype=torch.bool, device=x_new.device)"
             ".triu(k.shape[-2] - length)"),
    KnownBug("attend_with_cache", "no-mask",
             "looks like no causal mask is applied: a single new token may see the whole cache, "
             "but when several tokens arrive together each must not see the new ones after it",
             'weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)',
             "weights = torch.softmax(scores, dim=-1)"),
    KnownBug("attend_with_cache", "new-before-old",
             "looks like the new keys and values are put before the cached ones: append them "
             "after, in token order (torch.cat([k_cache, k_new], dim=-2))",
             "k = torch.cat([cache[0], k], dim=-2)  # (B, H, T_past + T_new, d)\n"
             "        v = torch.cat([cache[1], v], dim=-2)",
             "k = torch.cat([k, cache[0]], dim=-2)\n"
             "        v = torch.cat([v, cache[1]], dim=-2)"),
    KnownBug("attend_with_cache", "cache-without-new",
             "looks like the returned cache lacks the new tokens: return the cached keys and "
             "values with the new ones appended, shapes (B, H, T_past + T_new, d)",
             "return heads @ w_o.T, (k, v)", "return heads @ w_o.T, cache"),
    KnownBug("attend_with_cache", "mask-on-cpu", _ON_THE_CPU,
             "mask = causal_mask(length, k.shape[-2], device=x_new.device)",
             "mask = causal_mask(length, k.shape[-2])", error=_GPU_FAILURE),
    KnownBug("attend_with_cache", "scale-by-d-model", _SCALE_BY_D_MODEL,
             "/ math.sqrt(q.shape[-1])", "/ math.sqrt(x_new.shape[-1])"),
)
