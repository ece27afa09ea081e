"""Known bugs of chapter 3: splitting heads, multi-head attention, nn.MultiheadAttention."""

from grader.chapters import KnownBug

_SPLIT_RESHAPE = ("looks like x is viewed (or reshaped) straight to (..., H, T, d), which cuts the "
                  "memory of (T, D) into H blocks and mixes the features of different tokens in one "
                  "head; view it as (..., T, H, d) first, then transpose(-3, -2) (permute)")
_FRONT_AXES = ("looks like the axes are counted from the front (transpose(1, 2)), which is right "
               "only with exactly one batch dimension; count from the end: transpose(-3, -2)")
_HEAD_SCALE = ("looks like the scores are scaled by 1/sqrt(D), the width of all heads together "
               "(or of the model); each head uses 1/sqrt(D // H), the width of one head")
_NO_OUT = "looks like the output projection is not applied to the merged heads"
_VIEW_ON_TRANSPOSED = ("looks like .view is called on the transposed tensor, whose memory is no longer "
                       "laid out token by token: use .reshape, or call .contiguous() before .view")
# In the module, q, k and v are chunks of the fused projection: not contiguous either.
_VIEW_NOT_CONTIGUOUS = ("looks like .view is called on a tensor that is not contiguous (the heads "
                        "transposed, or a chunk of the fused qkv output), whose memory is not laid out "
                        "in the order of the new shape: call .contiguous() before .view, or use .reshape")
_VIEW_ERROR = r"view size is not compatible with input tensor's size and stride"
_NAN_FOR_EMPTY_ROWS = ("looks like a query whose keys are all masked gets NaN (softmax of a row of "
                       "-inf); the course's rule is zero weights, hence a zero output, for such a "
                       "query: find the rows with no key and fill their weights with 0")

BUGS = (
    # -- split_heads
    KnownBug("split_heads", "reshape-without-transpose", _SPLIT_RESHAPE,
             "return x.transpose(-3, -2)  # (..., H, T, d)",
             "return x.reshape(*batch, num_heads, length, width // num_heads)"),
    KnownBug("split_heads", "heads-axis-not-moved",
             "looks like the heads axis is left after the tokens: the result must be "
             "(..., H, T, d), not (..., T, H, d); move it with transpose(-3, -2)",
             "return x.transpose(-3, -2)  # (..., H, T, d)", "return x"),
    KnownBug("split_heads", "front-axes", _FRONT_AXES,
             "return x.transpose(-3, -2)  # (..., H, T, d)", "return x.transpose(1, 2)"),
    KnownBug("split_heads", "strided-heads",
             "looks like head h gets every H-th feature (h, h + H, ...) instead of the block "
             "h * d to (h + 1) * d: split the last dimension as (H, d), not (d, H)",
             "x = x.reshape(*batch, length, num_heads, width // num_heads)",
             "x = x.reshape(*batch, length, width // num_heads, num_heads).transpose(-2, -1)"),
    KnownBug("split_heads", "no-divisibility-check",
             "looks like D is not checked: raise a ValueError when D is not divisible by "
             "num_heads (if D % num_heads: raise ValueError(...))",
             "if width % num_heads:", "if False:", error=r"expected a ValueError"),
    # -- merge_heads
    KnownBug("merge_heads", "view-on-transposed", _VIEW_ON_TRANSPOSED,
             "return x.reshape(*batch, length, heads * width)",
             "return x.view(*batch, length, heads * width)", error=_VIEW_ERROR),
    KnownBug("merge_heads", "reshape-without-transpose",
             "looks like (..., H, T, d) is reshaped to (..., T, H * d) without moving the heads "
             "axis behind the tokens first: transpose(-3, -2), then reshape",
             "x = x.transpose(-3, -2)  # (..., T, H, d), no longer contiguous",
             "x = x.reshape(*batch, length, heads, width)"),
    KnownBug("merge_heads", "front-axes", _FRONT_AXES,
             "x = x.transpose(-3, -2)  # (..., T, H, d), no longer contiguous",
             "x = x.transpose(1, 2)"),
    KnownBug("merge_heads", "wrong-axes-swapped",
             "looks like the wrong pair of axes is swapped: move the heads axis (-3) behind "
             "the tokens (-2) with transpose(-3, -2)",
             "x = x.transpose(-3, -2)  # (..., T, H, d), no longer contiguous",
             "x = x.transpose(-2, -1)"),
    # -- multi_head_attention
    KnownBug("multi_head_attention", "scale-by-model-width", _HEAD_SCALE,
             "/ math.sqrt(q.shape[-1])", "/ math.sqrt(w_q.shape[0])"),
    KnownBug("multi_head_attention", "x-times-w",
             "looks like a projection computes x @ W instead of x @ W.T (weights are stored "
             "(d_out, d_in), as nn.Linear stores them)",
             # (n x d_in) @ (d_out x d_in): a weight not transposed, its columns the input's.
             "query @ w_q.T", "query @ w_q",
             error=r"mat1 and mat2 shapes cannot be multiplied \(\d+x(\d+) and \d+x\1\)"),
    KnownBug("multi_head_attention", "no-output-projection", _NO_OUT + " (@ w_o.T)",
             "merge_heads(weights @ v) @ w_o.T", "merge_heads(weights @ v)"),
    KnownBug("multi_head_attention", "merge-without-transpose",
             "looks like the heads' outputs (..., H, L, d_v) are reshaped to (..., L, H * d_v) "
             "without first moving the heads axis behind the queries (transpose(-3, -2))",
             "merge_heads(weights @ v) @ w_o.T",
             "(weights @ v).reshape(*query.shape[:-1], -1) @ w_o.T"),
    KnownBug("multi_head_attention", "mask-inverted",
             "looks like the mask is inverted: in this course True means the query may attend "
             "to the key (nn.MultiheadAttention's attn_mask uses the opposite)",
             "scores.masked_fill(~mask,", "scores.masked_fill(mask,"),
    KnownBug("multi_head_attention", "nan-for-empty-rows", _NAN_FOR_EMPTY_ROWS,
             "torch.softmax(scores.masked_fill(no_keys, 0.0), dim=-1).masked_fill(no_keys, 0.0)",
             "torch.softmax(scores, dim=-1)"),
    # The heads merged in place, without merge_heads: the .contiguous() pitfall.
    KnownBug("multi_head_attention", "view-without-contiguous", _VIEW_ON_TRANSPOSED,
             "merge_heads(weights @ v) @ w_o.T",
             "(weights @ v).transpose(-3, -2).view(*query.shape[:-1], -1) @ w_o.T",
             error=_VIEW_ERROR),
    # -- MultiHeadAttention
    KnownBug("MultiHeadAttention", "dropout-on-output",
             "looks like dropout is applied to the output instead of the attention weights: "
             "drop weights (each query forgets some keys), not output features",
             "weights = F.dropout(weights, p=self.dropout, training=self.training)\n"
             "        output = self.out(merge_heads(weights @ v))",
             "output = F.dropout(self.out(merge_heads(weights @ v)), p=self.dropout, "
             "training=self.training)"),
    KnownBug("MultiHeadAttention", "dropout-in-eval",
             "looks like dropout also runs in eval mode: F.dropout's training argument defaults "
             "to True, so pass training=self.training (or use an nn.Dropout module)",
             "F.dropout(weights, p=self.dropout, training=self.training)",
             "F.dropout(weights, p=self.dropout)"),
    KnownBug("MultiHeadAttention", "weights-averaged",
             "looks like the weights are averaged over the heads (nn.MultiheadAttention's "
             "default); return one matrix per head, shape (..., H, T, T)",
             "return (output, weights) if need_weights else output",
             "return (output, weights.mean(dim=-3)) if need_weights else output"),
    KnownBug("MultiHeadAttention", "qk-swapped",
             "looks like the fused projection is split in the wrong order: its output holds q, "
             "then k, then v, as the rows of in_proj_weight are [W_q; W_k; W_v]",
             "q, k, v = self.qkv(x).chunk(3, dim=-1)", "k, q, v = self.qkv(x).chunk(3, dim=-1)"),
    KnownBug("MultiHeadAttention", "scale-by-model-width", _HEAD_SCALE,
             "math.sqrt(q.shape[-1])", "math.sqrt(x.shape[-1])"),
    KnownBug("MultiHeadAttention", "reshape-without-transpose", _SPLIT_RESHAPE,
             "q, k, v = (split_heads(t, self.num_heads) for t in (q, k, v))",
             "q, k, v = (t.reshape(*t.shape[:-2], self.num_heads, t.shape[-2], -1) "
             "for t in (q, k, v))"),
    KnownBug("MultiHeadAttention", "no-output-projection", _NO_OUT + " (self.out)",
             "output = self.out(merge_heads(weights @ v))", "output = merge_heads(weights @ v)"),
    KnownBug("MultiHeadAttention", "nan-for-empty-rows", _NAN_FOR_EMPTY_ROWS,
             "torch.softmax(scores.masked_fill(no_keys, 0.0), dim=-1).masked_fill(no_keys, 0.0)",
             "torch.softmax(scores, dim=-1)"),
    # nanoGPT's y.transpose(1, 2).contiguous().view(B, T, C) without .contiguous().
    KnownBug("MultiHeadAttention", "view-without-contiguous", _VIEW_NOT_CONTIGUOUS,
             "output = self.out(merge_heads(weights @ v))",
             "output = self.out((weights @ v).transpose(-3, -2).view(*x.shape))", error=_VIEW_ERROR),
    KnownBug("MultiHeadAttention", "bias-ignored",
             "looks like qkv has a bias even when bias=False: pass bias=bias to both nn.Linear",
             "self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)",
             "self.qkv = nn.Linear(d_model, 3 * d_model)",
             error=r'does not expect: qkv\.bias|Missing key\(s\) in state_dict: "qkv\.bias"'),
    # -- torch_multihead_forward
    KnownBug("torch_multihead_forward", "padding-mask-not-inverted",
             "looks like key_padding_mask is read in the course's convention; in "
             "nn.MultiheadAttention True marks a key to IGNORE, so mask where it is True",
             "scores.masked_fill(key_padding_mask[:, None, None, :],",
             "scores.masked_fill(~key_padding_mask[:, None, None, :],"),
    KnownBug("torch_multihead_forward", "batch-first-ignored",
             "looks like batch_first is ignored: with batch_first=False (the default) inputs "
             "and output are (L, N, E), sequence first; transpose to (N, L, E) to compute, and "
             "back at the end",
             "sequence_first = not batch_first", "sequence_first = False"),
    KnownBug("torch_multihead_forward", "output-not-transposed-back",
             "looks like the output stays (N, L, E); with batch_first=False it must come back "
             "in query's layout, (L, N, E)",
             "return output.transpose(0, 1) if sequence_first else output", "return output"),
    KnownBug("torch_multihead_forward", "in-proj-bias-ignored",
             "looks like in_proj_bias is not added: its three thirds are the biases of q, k "
             "and v, in that order",
             "in_proj_bias.chunk(3) if in_proj_bias is not None else (None, None, None)",
             "(None, None, None)"),
    KnownBug("torch_multihead_forward", "no-output-projection",
             _NO_OUT + " (out_proj_weight and out_proj_bias)",
             "F.linear(merge_heads(weights @ v), out_proj_weight, out_proj_bias)",
             "merge_heads(weights @ v)"),
    KnownBug("torch_multihead_forward", "scale-by-model-width", _HEAD_SCALE,
             "math.sqrt(q.shape[-1])", "math.sqrt(query.shape[-1])"),
    # -- parameter_count
    KnownBug("parameter_count", "per-head",
             "looks like the parameters are counted once per head; heads slice the projections "
             "and add no parameters, so the count does not depend on num_heads",
             "return 4 * per_projection", "return 4 * per_projection * num_heads"),
    KnownBug("parameter_count", "no-output-projection",
             "looks like the output projection (a D x D weight and a bias of D) is not counted",
             "return 4 * per_projection", "return 3 * per_projection"),
    KnownBug("parameter_count", "biases-forgotten",
             "looks like the biases are not counted: with bias=True each projection also has "
             "one bias per output feature",
             "d_model * d_model + (d_model if bias else 0)", "d_model * d_model"),
    KnownBug("parameter_count", "bias-always-counted",
             "looks like the biases are counted even when bias=False",
             "(d_model if bias else 0)", "d_model"),
)
