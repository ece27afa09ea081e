"""Known bugs of chapter 1: softmax and scaled dot-product attention."""

from grader.bugs import KnownBug

_UNSCALED = "looks like the scores are not multiplied by 1/sqrt(d_k)"
_OVER_QUERIES = ("looks like the softmax runs over the queries (dim=-2); each query's "
                 "weights must sum to 1 over the keys (dim=-1)")
_NO_MAX = "looks like the maximum is not subtracted before exp (exp overflows, then NaN)"

BUGS = (
    KnownBug("softmax", "no-max-shift", _NO_MAX,
             "exps = torch.exp(x - shift)", "exps = torch.exp(x)"),
    KnownBug("softmax", "sum-of-everything",
             "looks like you divide by the sum of all entries instead of the sum along dim",
             "exps.sum(dim=dim, keepdim=True)", "exps.sum()"),
    KnownBug("scaled_dot_product_attention", "no-scale", _UNSCALED,
             "scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0"),
    KnownBug("scaled_dot_product_attention", "scale-by-d",
             "looks like the scores are divided by d_k instead of sqrt(d_k)",
             "scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0 / q.shape[-1]"),
    KnownBug("scaled_dot_product_attention", "softmax-over-queries", _OVER_QUERIES,
             "softmax(scores.masked_fill(no_keys, 0.0), dim=-1)",
             "softmax(scores.masked_fill(no_keys, 0.0), dim=-2)"),
    KnownBug("scaled_dot_product_attention", "mask-inverted",
             "looks like the mask is inverted: in this course True means the query "
             "may attend to the key (nn.MultiheadAttention uses the opposite)",
             "scores.masked_fill(~mask,", "scores.masked_fill(mask,"),
    KnownBug("scaled_dot_product_attention", "weights-transposed",
             "looks like the weights are transposed: they have one row per query, "
             "shape (..., L, S)",
             "return weights @ v, weights", "return weights @ v, weights.transpose(-2, -1)"),
    KnownBug("scaled_dot_product_attention", "finite-mask-fill",
             "looks like masked scores are set to a finite number such as -1e9: a query "
             "whose keys are all masked then averages every value instead of giving zeros",
             'scores.masked_fill(~mask, float("-inf"))', "scores.masked_fill(~mask, -1e9)"),
    KnownBug("scaled_dot_product_attention", "nan-for-empty-rows",
             "looks like a query whose keys are all masked gets NaN; the course's rule "
             "is zero weights and zero output for such a query",
             "weights = softmax(scores.masked_fill(no_keys, 0.0), dim=-1)  # (..., L, S)\n"
             "    weights = weights.masked_fill(no_keys, 0.0)",
             "weights = softmax(scores, dim=-1)  # (..., L, S)"),
    KnownBug("self_attention", "x-times-w",
             "looks like the projections compute x @ W instead of x @ W.T (weights are "
             "stored (d_out, d_in), as nn.Linear stores them)",
             "q = x @ w_q.T", "q = x @ w_q"),
    KnownBug("self_attention", "query-weights-for-keys",
             "looks like the keys are projected with w_q instead of w_k",
             "k = x @ w_k.T", "k = x @ w_q.T"),
    KnownBug("softmax_numpy", "no-max-shift", _NO_MAX,
             "exps = np.exp(x - shift)", "exps = np.exp(x)"),
    KnownBug("scaled_dot_product_attention_numpy", "no-scale", _UNSCALED,
             "scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0"),
    KnownBug("scaled_dot_product_attention_numpy", "softmax-over-queries", _OVER_QUERIES,
             "softmax_numpy(np.where(no_keys, 0, scores), axis=-1)",
             "softmax_numpy(np.where(no_keys, 0, scores), axis=-2)"),
)
