"""Known bugs of chapter 6: grouped-query and multi-query attention."""

from grader.chapters import KnownBug

_TILED = ("looks like the K/V heads are tiled with repeat (0, 1, 0, 1, ...) instead of repeated in "
          "place with repeat_interleave (0, 0, 1, 1, ...): query head h must use K/V head h // group, "
          "group = H_q // H_kv, so the query heads of one group are consecutive")
_SIZE_MISMATCH = r"size of tensor a \(\d+\) must match the size of tensor b \(\d+\) at non-singleton dimension 1"

BUGS = (
    # -- expand_kv_heads ---------------------------------------------------------------
    KnownBug("expand_kv_heads", "tiled", _TILED,
             "return kv.repeat_interleave(group, dim=1)", "return kv.repeat(1, group, 1, 1)"),
    KnownBug("expand_kv_heads", "repeated-h-q-times",
             "looks like each K/V head is repeated H_q times, which gives H_kv * H_q heads; repeat "
             "it group = H_q // H_kv times",
             "return kv.repeat_interleave(group, dim=1)",
             "return kv.repeat_interleave(num_query_heads, dim=1)"),
    KnownBug("expand_kv_heads", "tokens-axis",
             "looks like the tokens (dim 2) are repeated instead of the heads: repeat along the "
             "heads axis, dim=1 of (B, H_kv, S, d)",
             "return kv.repeat_interleave(group, dim=1)", "return kv.repeat_interleave(group, dim=2)"),
    KnownBug("expand_kv_heads", "no-dim",
             "looks like repeat_interleave is called without dim=, which flattens the tensor "
             "first; pass dim=1, the heads axis",
             "return kv.repeat_interleave(group, dim=1)", "return kv.repeat_interleave(group)"),
    KnownBug("expand_kv_heads", "no-divisibility-check",
             "looks like H_q is not checked: raise a ValueError when H_q is not a multiple of H_kv "
             "(H_q // H_kv would silently drop query heads)",
             "if num_query_heads % num_kv_heads:", "if False:", error=r"expected a ValueError"),
    # -- grouped_query_attention -------------------------------------------------------------
    KnownBug("grouped_query_attention", "tiled", _TILED,
             "k = expand_kv_heads(k, num_query_heads)  # (B, H_q, S, d)\n"
             "    v = expand_kv_heads(v, num_query_heads)  # (B, H_q, S, d_v)",
             "k = k.repeat(1, num_query_heads // k.shape[1], 1, 1)\n"
             "    v = v.repeat(1, num_query_heads // v.shape[1], 1, 1)"),
    KnownBug("grouped_query_attention", "values-not-expanded",
             "looks like the keys are expanded to H_q heads but the values are not: the weights "
             "(B, H_q, L, S) need values (B, H_q, S, d_v), expand_kv_heads(v, H_q)",
             "v = expand_kv_heads(v, num_query_heads)  # (B, H_q, S, d_v)", "",
             error=_SIZE_MISMATCH),
    KnownBug("grouped_query_attention", "mask-inverted",
             "looks like the mask is inverted: in this course True means the query may attend to "
             "the key; fill -inf where the mask is False (~mask)",
             "scores.masked_fill(~mask,", "scores.masked_fill(mask,"),
    KnownBug("grouped_query_attention", "nan-for-empty-rows",
             "looks like a query whose keys are all masked gets NaN (softmax of a row of -inf); the "
             "course's rule is zero weights, hence a zero output, for such a query",
             "torch.softmax(scores.masked_fill(no_keys, 0.0), dim=-1).masked_fill(no_keys, 0.0)",
             "torch.softmax(scores, dim=-1)"),
    KnownBug("grouped_query_attention", "no-scale",
             "looks like the scores are not divided by sqrt(d), the width of one head",
             "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
             "scores = q @ k.transpose(-2, -1)"),
    # -- GroupedQueryAttention ---------------------------------------------------------------
    KnownBug("GroupedQueryAttention", "kv-projections-full-width",
             "looks like k_proj (or v_proj) maps D to D features, as in multi-head attention; "
             "with H_kv K/V heads it maps D to H_kv * d: that narrower projection is GQA's saving",
             "self.k_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=bias)",
             "self.k_proj = nn.Linear(d_model, d_model, bias=bias)",
             error=r"k_proj\.weight has shape"),
    KnownBug("GroupedQueryAttention", "kv-split-without-transpose",
             "looks like the keys (B, T, H_kv * d) are viewed straight as (B, H_kv, T, d), which "
             "mixes the features of different tokens in one head; view as (B, T, H_kv, d), then "
             "transpose(1, 2)",
             "k = self.k_proj(x).view(batch, length, self.num_kv_heads, -1).transpose(1, 2)",
             "k = self.k_proj(x).view(batch, self.num_kv_heads, length, -1)"),
    KnownBug("GroupedQueryAttention", "values-from-k-proj",
             "looks like the values come from k_proj: v = v_proj(x)",
             "v = self.v_proj(x)", "v = self.k_proj(x)"),
    KnownBug("GroupedQueryAttention", "mask-ignored",
             "looks like the mask is not passed on to the attention: blocked keys must get no weight",
             "heads, _ = grouped_query_attention(q, k, v, mask)",
             "heads, _ = grouped_query_attention(q, k, v)"),
    KnownBug("GroupedQueryAttention", "no-output-projection",
             "looks like the output projection is not applied to the merged heads (self.out_proj)",
             "return self.out_proj(heads.transpose(1, 2).reshape(batch, length, -1))",
             "return heads.transpose(1, 2).reshape(batch, length, -1)"),
    KnownBug("GroupedQueryAttention", "bias-ignored",
             "looks like q_proj has a bias even when bias=False: pass bias=bias to every nn.Linear",
             "self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=bias)",
             "self.q_proj = nn.Linear(d_model, num_heads * head_dim)",
             error=r"does not expect: q_proj\.bias"),
    # -- kv_cache_bytes ----------------------------------------------------------------------
    KnownBug("kv_cache_bytes", "keys-only",
             "looks like only the keys are counted: every layer caches a key AND a value per K/V "
             "head and token, hence the factor 2",
             "per_token = 2 * num_kv_heads * head_dim", "per_token = num_kv_heads * head_dim"),
    KnownBug("kv_cache_bytes", "bits-not-bytes",
             "looks like the size of a number is counted in bits (torch.finfo(dtype).bits); the "
             "answer is in bytes: dtype.itemsize (2 for bfloat16)",
             "dtype.itemsize", "torch.finfo(dtype).bits"),
    KnownBug("kv_cache_bytes", "float32-assumed",
             "looks like every number takes 4 bytes whatever the dtype: use dtype.itemsize "
             "(2 for float16 and bfloat16, 1 for int8)",
             "dtype.itemsize", "4"),
    KnownBug("kv_cache_bytes", "layers-forgotten",
             "looks like one layer is counted: every attention layer keeps its own cache",
             "batch * seq_len * num_layers * per_token", "batch * seq_len * per_token"),
    KnownBug("kv_cache_bytes", "finfo-for-integers",
             "looks like the bits per number come from torch.finfo, which has no answer for integer "
             "dtypes such as torch.int8 (a quantized cache); dtype.itemsize gives the bytes of one "
             "number of any dtype",
             "dtype.itemsize", "(torch.finfo(dtype).bits // 8)",
             error=r"torch\.finfo\(\) requires a floating point"),
    KnownBug("kv_cache_bytes", "float-result",
             "looks like the bytes come back as a float (bits / 8): return an int, with "
             "dtype.itemsize or bits // 8",
             "dtype.itemsize", "torch.finfo(dtype).bits / 8"),
)
