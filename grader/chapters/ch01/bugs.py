"""Known bugs of chapter 1: softmax and scaled dot-product attention."""

from grader.chapters import KnownBug

_UNSCALED = "looks like the scores are not multiplied by 1/sqrt(d_k)"
_OVER_QUERIES = ("looks like the softmax runs over the queries (dim=-2); each query's "
                 "weights must sum to 1 over the keys (dim=-1)")
_NO_MAX = "looks like the maximum is not subtracted before exp (exp overflows, then NaN)"
_SUM_OF_EVERYTHING = "looks like you divide by the sum of all entries instead of the sum along dim"
_LAST_AXIS_SUM = ("looks like the sum runs over the last axis whatever dim says: sum along "
                  "dim (keepdim=True) so that each slice along dim sums to 1")

_X_TIMES_W = ("looks like the projections compute x @ W instead of x @ W.T (weights are "
              "stored (d_out, d_in), as nn.Linear stores them)")

BUGS = (
    KnownBug("softmax", "no-max-shift", _NO_MAX,
             "exps = torch.exp(x - shift)", "exps = torch.exp(x)"),
    KnownBug("softmax", "sum-of-everything", _SUM_OF_EVERYTHING,
             "exps.sum(dim=dim, keepdim=True)", "exps.sum()"),
    KnownBug("softmax", "sum-over-last-axis", _LAST_AXIS_SUM,
             "exps.sum(dim=dim, keepdim=True)", "exps.sum(dim=-1, keepdim=True)"),
    KnownBug("softmax", "max-over-last-axis",
             "looks like the maximum is taken over the last axis whatever dim says: the "
             "shift must be one number per slice along dim (x.amax(dim=dim, keepdim=True))",
             "shift = x.amax(dim=dim, keepdim=True)", "shift = x.amax(dim=-1, keepdim=True)"),
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
    # One slip, three lines: each alone, and all three together (known_bugs.combinations).
    KnownBug("self_attention", "x-times-w", _X_TIMES_W, "q = x @ w_q.T", "q = x @ w_q"),
    KnownBug("self_attention", "x-times-w-for-keys", _X_TIMES_W, "k = x @ w_k.T", "k = x @ w_k"),
    KnownBug("self_attention", "x-times-w-for-values", _X_TIMES_W, "v = x @ w_v.T", "v = x @ w_v"),
    KnownBug("self_attention", "query-weights-for-keys",
             "looks like the keys are projected with w_q instead of w_k",
             "k = x @ w_k.T", "k = x @ w_q.T"),
    KnownBug("self_attention", "mask-not-passed",
             "looks like the mask is not passed on: hand it to scaled_dot_product_attention "
             "(mask=mask)",
             "scaled_dot_product_attention(q, k, v, mask=mask)", "scaled_dot_product_attention(q, k, v)"),
    KnownBug("self_attention", "queries-and-keys-swapped",
             "looks like queries and keys are swapped in the call: scaled_dot_product_attention "
             "takes (q, k, v), and the weights then come out transposed",
             "scaled_dot_product_attention(q, k, v, mask=mask)",
             "scaled_dot_product_attention(k, q, v, mask=mask)"),
    KnownBug("softmax_numpy", "no-max-shift", _NO_MAX,
             "exps = np.exp(x - shift)", "exps = np.exp(x)"),
    KnownBug("softmax_numpy", "sum-of-everything", _SUM_OF_EVERYTHING,
             "np.sum(exps, axis=axis, keepdims=True)", "np.sum(exps)"),
    KnownBug("softmax_numpy", "sum-over-last-axis", _LAST_AXIS_SUM,
             "np.sum(exps, axis=axis, keepdims=True)", "np.sum(exps, axis=-1, keepdims=True)"),
    KnownBug("softmax_numpy", "no-keepdims",
             "looks like the sum drops the summed axis (keepdims=False), so it broadcasts "
             "against the wrong axis of exps: keep it with keepdims=True",
             "np.sum(exps, axis=axis, keepdims=True)", "np.sum(exps, axis=axis)",
             error=r"operands could not be broadcast together"),
    KnownBug("scaled_dot_product_attention_numpy", "no-scale", _UNSCALED,
             "scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0"),
    KnownBug("scaled_dot_product_attention_numpy", "softmax-over-queries", _OVER_QUERIES,
             "softmax_numpy(np.where(no_keys, 0, scores), axis=-1)",
             "softmax_numpy(np.where(no_keys, 0, scores), axis=-2)"),
    KnownBug("scaled_dot_product_attention_numpy", "mask-inverted",
             "looks like the mask is inverted: True means the query may attend to the key, "
             "so keep the scores where the mask is True (np.where(mask, scores, -np.inf))",
             "np.where(mask, scores, -np.inf)", "np.where(mask, -np.inf, scores)"),
    KnownBug("scaled_dot_product_attention_numpy", "weights-transposed",
             "looks like the weights are transposed: they have one row per query, "
             "shape (..., L, S)",
             "return weights @ v, weights", "return weights @ v, np.swapaxes(weights, -2, -1)"),
)
