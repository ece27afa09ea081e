"""Known bugs of chapter 2: padding masks, mask conventions, cross-attention."""

from grader.chapters import KnownBug

_BROADCAST_PITFALL = ("looks like the (B, S) padding mask meets the scores without a query axis: "
                      "against (B, L, S) its batch axis lines up with the queries (silently when "
                      "B == L); use key_padding[:, None, :], shape (B, 1, S)")

# The error of a mask that does not broadcast against (B, L, S) scores, raised
# on a line that masks them; ``line`` narrows down what that line holds.
_PADDING_MISMATCH = (r"(masked_fill|where)\(.*{line}.*must match the size of tensor b \(\d+\) "
                     r"at non-singleton dimension 1")

BUGS = (
    # -- padding_mask
    KnownBug("padding_mask", "less-or-equal",
             "looks like position lengths[b] counts as real (<= instead of <): positions start "
             "at 0, so the real tokens are s < lengths[b]",
             "return positions < lengths.unsqueeze(-1)", "return positions <= lengths.unsqueeze(-1)"),
    KnownBug("padding_mask", "true-at-padding",
             "looks like the mask is True at the padding; this course's masks are True where a "
             "token is real (may be attended to)",
             "return positions < lengths.unsqueeze(-1)", "return positions >= lengths.unsqueeze(-1)"),
    KnownBug("padding_mask", "positions-from-one",
             "looks like positions are counted from 1 (torch.arange(1, S + 1)): the first token "
             "is position 0, so each row has one real token too few",
             "positions = torch.arange(max_len, device=lengths.device)",
             "positions = torch.arange(1, max_len + 1, device=lengths.device)"),
    KnownBug("padding_mask", "max-len-ignored",
             "looks like max_len is ignored: when it is given, the mask has max_len columns, "
             "even if every sequence is shorter",
             "positions = torch.arange(max_len, device=lengths.device)",
             "positions = torch.arange(int(lengths.max()), device=lengths.device)"),
    KnownBug("padding_mask", "transposed",
             "looks like the mask is transposed, (S, B): it has one row per sequence, (B, S); "
             "compare positions (1, S) with lengths[:, None] (B, 1)",
             "return positions < lengths.unsqueeze(-1)", "return positions.unsqueeze(-1) < lengths"),
    # -- convert_mask
    KnownBug("convert_mask", "dtype-ignored",
             "looks like dtype is ignored: the additive mask must have the dtype it is asked for",
             "additive = torch.zeros(attend.shape, dtype=dtype, device=attend.device)",
             "additive = torch.zeros(attend.shape, device=attend.device)"),
    KnownBug("convert_mask", "block-read-as-attend",
             "looks like a \"block\" mask is read without inverting it: True in a \"block\" mask "
             "hides the key, so attend = ~mask",
             "attend = ~mask", "attend = mask"),
    KnownBug("convert_mask", "block-written-as-attend",
             "looks like the \"block\" result is not inverted: nn.MultiheadAttention's masks are "
             "True where the key is hidden, the opposite of \"attend\"",
             "return ~attend", "return attend"),
    KnownBug("convert_mask", "additive-finite-fill",
             "looks like blocked entries of the additive mask are a large finite number such as "
             "-1e9; use exactly -inf, or a query whose keys are all blocked averages every value",
             'return additive.masked_fill(~attend, float("-inf"))',
             "return additive.masked_fill(~attend, -1e9)"),
    KnownBug("convert_mask", "additive-read-as-zero",
             "looks like an additive mask keeps only its entries equal to 0; every entry that is "
             "not -inf is kept (finite values are biases added to the scores)",
             "attend = ~torch.isneginf(mask)", "attend = mask == 0"),
    KnownBug("convert_mask", "bool-cast-to-float",
             "looks like the bool mask is cast to float (1.0 kept, 0.0 blocked); an additive mask "
             "holds 0.0 where a key is kept and -inf where it is hidden",
             'return additive.masked_fill(~attend, float("-inf"))', "return attend.to(dtype)"),
    KnownBug("convert_mask", "additive-inverted",
             "looks like the additive mask puts -inf on the kept entries and 0 on the blocked ones",
             'return additive.masked_fill(~attend, float("-inf"))',
             'return additive.masked_fill(attend, float("-inf"))'),
    # -- combine_masks
    KnownBug("combine_masks", "padding-on-query-axis",
             "looks like the padding mask sits on the query axis, (B, 1, S, 1): padding hides "
             "keys, so it goes last: key_padding[:, None, None, :], shape (B, 1, 1, S)",
             "combined = key_padding[:, None, None, :]", "combined = key_padding[:, None, :, None]"),
    KnownBug("combine_masks", "padding-not-reshaped",
             "looks like key_padding is used as it is, (B, S): against (B, H, L, S) scores it lines "
             "up from the right, its batch axis with the queries L (silently wrong when B == L); "
             "give it axes for the heads and the queries: key_padding[:, None, None, :], shape "
             "(B, 1, 1, S)",
             "combined = key_padding[:, None, None, :]", "combined = key_padding"),
    KnownBug("combine_masks", "no-head-axis",
             "looks like the padding mask is (B, 1, S), the shape for (B, L, S) scores: against "
             "(B, H, L, S) its batch axis lines up with the heads; make it (B, 1, 1, S)",
             "combined = key_padding[:, None, None, :]", "combined = key_padding[:, None, :]"),
    KnownBug("combine_masks", "or-instead-of-and",
             "looks like the masks are combined with | (or): a pair may be attended only where "
             "both masks allow it, key_padding & attn_mask",
             "combined = combined & attn_mask.unsqueeze(1)", "combined = combined | attn_mask.unsqueeze(1)"),
    KnownBug("combine_masks", "key-padding-inverted",
             "looks like key_padding is inverted; it is True at real keys, as padding_mask "
             "returns it (nn.MultiheadAttention's key_padding_mask is the opposite)",
             "combined = key_padding[:, None, None, :]", "combined = ~key_padding[:, None, None, :]"),
    KnownBug("combine_masks", "shared-mask-not-batched",
             "looks like an (L, S) attn_mask gets unsqueeze(1) like a (B, L, S) one, which makes "
             "it (L, 1, S); give it a batch axis first: attn_mask[None, None] is (1, 1, L, S)",
             "attn_mask = attn_mask.unsqueeze(0)  # (1, L, S)", "pass"),
    KnownBug("combine_masks", "per-sequence-mask-on-heads",
             "looks like a (B, L, S) attn_mask is unsqueezed at dim 0, which puts the batch on "
             "the head axis; unsqueeze(1) makes it (B, 1, L, S)",
             "combined = combined & attn_mask.unsqueeze(1)", "combined = combined & attn_mask.unsqueeze(0)"),
    # -- cross_attention
    KnownBug("cross_attention", "no-scale",
             "looks like the scores are not divided by sqrt(d_k)",
             "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
             "scores = q @ k.transpose(-2, -1)"),
    KnownBug("cross_attention", "scale-by-input-width",
             "looks like the scores are divided by sqrt of the input width x.shape[-1]; divide by "
             "sqrt(d_k), the width of the queries and keys (q.shape[-1])",
             "/ math.sqrt(q.shape[-1])", "/ math.sqrt(x.shape[-1])"),
    # When L != S (or B != L) both padding mistakes raise instead of giving a
    # wrong value; the line the message quotes tells them apart, so the
    # query-axis one (a trailing None or unsqueeze(-1)) is tried first.
    KnownBug("cross_attention", "padding-hides-queries",
             "looks like the context's padding hides queries (rows) instead of keys (columns): "
             "mask the scores with key_padding[:, None, :], shape (B, 1, S); every query still "
             "gets an output",
             "scores.masked_fill(~keys.unsqueeze(-2),", "scores.masked_fill(~keys.unsqueeze(-1),",
             error=_PADDING_MISMATCH.format(line=r"(unsqueeze\((-1|2)\)|None\])")),
    KnownBug("cross_attention", "padding-mask-without-query-axis", _BROADCAST_PITFALL,
             "scores.masked_fill(~keys.unsqueeze(-2),", "scores.masked_fill(~keys,",
             error=_PADDING_MISMATCH.format(line="")),
    KnownBug("cross_attention", "padding-mask-inverted",
             "looks like the padding mask is inverted: the real keys are hidden and the padded "
             "ones attended to",
             "scores.masked_fill(~keys.unsqueeze(-2),", "scores.masked_fill(keys.unsqueeze(-2),"),
    KnownBug("cross_attention", "nan-for-empty-context",
             "looks like a sequence with an empty context gets NaN; the course's rule is zero "
             "weights and a zero output for a query with no key, as F.scaled_dot_product_attention "
             "gives",
             "weights = torch.softmax(scores.masked_fill(no_keys, 0.0), dim=-1)\n"
             "    weights = weights.masked_fill(no_keys, 0.0)  # (B, L, S)",
             "weights = torch.softmax(scores, dim=-1)  # (B, L, S)"),
    KnownBug("cross_attention", "finite-mask-fill",
             "looks like padded keys get a large finite score such as -1e9: a query with an empty "
             "context then averages the padding's values instead of giving zeros; use -inf",
             'float("-inf")', "-1e9"),
    KnownBug("cross_attention", "keys-from-x",
             "looks like the keys and values are computed from x, as in self-attention; in "
             "cross-attention they come from the context: context @ w_k.T, context @ w_v.T",
             "k = context @ w_k.T  # (B, S, d_k)\n    v = context @ w_v.T",
             "k = x @ w_k.T  # (B, S, d_k)\n    v = x @ w_v.T"),
    KnownBug("cross_attention", "queries-from-context",
             "looks like the queries are computed from the context; they come from x "
             "(x @ w_q.T), one per token of x, so the output is (B, L, d_v)",
             "q = x @ w_q.T", "q = context @ w_q.T"),
)
