"""Known bugs of chapter 7: memory-efficient attention."""

from grader.chapters import KnownBug

BUGS = (
    # -- online_softmax ----------------------------------------------------------------------
    KnownBug("online_softmax", "sum-not-rescaled",
             "looks like the running sum is not rescaled when the max grows: the sum so far was "
             "taken against the old max, so multiply it by exp(m_old - m_new) before adding the block",
             "l = l * torch.exp(m - m_new) + torch.exp(block - m_new[..., None]).sum(dim=-1)",
             "l = l + torch.exp(block - m_new[..., None]).sum(dim=-1)"),
    KnownBug("online_softmax", "rescale-inverted",
             "looks like the running sum is rescaled by exp(m_new - m_old), upside down: the factor "
             "that turns exp(x - m_old) into exp(x - m_new) is exp(m_old - m_new), at most 1",
             "l = l * torch.exp(m - m_new) +", "l = l * torch.exp(m_new - m) +"),
    KnownBug("online_softmax", "no-max-shift",
             "looks like exp is taken of the raw logits: with logits of a few hundred exp overflows "
             "to inf; subtract the running max before exp",
             "return torch.exp(x - m[..., None]) / l[..., None]",
             "return torch.exp(x) / (l * torch.exp(m))[..., None]"),
    KnownBug("online_softmax", "last-block-dropped",
             "looks like the last, shorter block is skipped when block_size does not divide N: "
             "range(0, N, block_size) reaches every entry, the slice x[..., start:start + block_size] "
             "stops at N by itself",
             "for start in range(0, n, block_size):",
             "for start in range(0, n - n % block_size, block_size):"),
    KnownBug("online_softmax", "sum-overwritten",
             "looks like the running sum is replaced by each block's sum instead of added to: "
             "l = l * exp(m_old - m_new) + the block's sum of exp(x - m_new)",
             "l = l * torch.exp(m - m_new) + torch.exp(block - m_new[..., None]).sum(dim=-1)",
             "l = torch.exp(block - m_new[..., None]).sum(dim=-1)"),
    # -- tiled_attention ---------------------------------------------------------------------
    KnownBug("tiled_attention", "whole-score-matrix",
             "looks like the whole (L, S) score matrix is built at once, as in chapter 1: right "
             "numbers, but the memory FlashAttention saves is spent; take the keys block_size at "
             "a time, and keep only (L, block_size) scores",
             "for start in range(0, num_keys, block_size):\n"
             "        end = min(start + block_size, num_keys)",
             "for start in range(0, num_keys, num_keys):\n"
             "        end = num_keys"),
    KnownBug("tiled_attention", "output-not-rescaled",
             "looks like the running output is not rescaled when the max grows: acc holds values "
             "weighted by exp(score - m_old), so multiply it by exp(m_old - m_new) too, as the sum",
             "acc = acc * rescale + p @ v[..., start:end, :]", "acc = acc + p @ v[..., start:end, :]"),
    KnownBug("tiled_attention", "sum-not-rescaled",
             "looks like the running sum l is not rescaled when the max grows: multiply it by "
             "exp(m_old - m_new) before adding the block's sum, as the output",
             "l = l * rescale + p.sum(dim=-1, keepdim=True)", "l = l + p.sum(dim=-1, keepdim=True)"),
    KnownBug("tiled_attention", "last-block-dropped",
             "looks like the last, shorter block of keys is skipped when block_size does not "
             "divide S: range(0, S, block_size) reaches every key",
             "for start in range(0, num_keys, block_size):",
             "for start in range(0, num_keys - num_keys % block_size, block_size):"),
    KnownBug("tiled_attention", "block-local-key-positions",
             "looks like the causal mask uses positions inside the block (0 .. block - 1) for the "
             "keys: key j of the block starting at `start` is key start + j",
             "keys = torch.arange(start, end, device=q.device)",
             "keys = torch.arange(end - start, device=q.device)"),
    KnownBug("tiled_attention", "causal-top-left",
             "looks like the causal mask is aligned top-left (query i sees keys 0 .. i); with L "
             "queries and S keys, query i is at position i + S - L (bottom-right, chapter 4)",
             "[:, None] + (num_keys - num_queries)", "[:, None]"),
    KnownBug("tiled_attention", "nan-for-queries-without-keys",
             "looks like a query with no key to see (causal, L > S) divides 0 by 0, or subtracts "
             "a max of -inf; its output must be 0: shift by 0 where the max is still -inf, and "
             "divide by 1 where l is 0",
             "out = acc / l.masked_fill(l == 0, 1.0)", "out = acc / l"),
    KnownBug("tiled_attention", "no-scale",
             "looks like the scores are not multiplied by 1 / sqrt(d)",
             "scores = q @ k[..., start:end, :].transpose(-2, -1) * scale",
             "scores = q @ k[..., start:end, :].transpose(-2, -1)"),
    KnownBug("tiled_attention", "lse-is-max",
             "looks like lse is the running max m: l sums exp(score - m), so the log of the sum of "
             "exp(score) is m + log l, larger than m by log l (up to log S)",
             "lse = m + torch.log(l)", "lse = m"),
    KnownBug("tiled_attention", "lse-without-max",
             "looks like lse is log l alone: l sums exp(score - m), taken against the max, so the "
             "log of the sum of exp(score) is m + log l; add the max back",
             "lse = m + torch.log(l)", "lse = torch.log(l)"),
    KnownBug("tiled_attention", "exp-overflows",
             "looks like lse is log(l * exp(m)): right in exact arithmetic, but exp of a score in "
             "the hundreds overflows to inf; m + log l is the same number without exp",
             "lse = m + torch.log(l)", "lse = torch.log(l * torch.exp(m))"),
    KnownBug("tiled_attention", "lse-zero-without-keys",
             "looks like a query with no key to see gets lse 0: the sum of exp(score) over no key is "
             "0 and its log -inf (m + log l with m = -inf, l = 0), the value that gives such a part "
             "weight exp(-inf) = 0 in a merge; only the output's division needs l made safe",
             "lse = m + torch.log(l)", "lse = shift + torch.log(l.masked_fill(l == 0, 1.0))"),
    KnownBug("tiled_attention", "lse-scaled-twice",
             "looks like the max is multiplied by the scale again in lse (m * scale + log l): that "
             "is for a max of raw scores q . k, as FlashAttention's kernels keep it; here the "
             "scores, and so m, already include 1 / sqrt(d)",
             "lse = m + torch.log(l)", "lse = m * scale + torch.log(l)"),
    KnownBug("tiled_attention", "lse-keepdim",
             "looks like lse keeps the last dimension of m and l, shape (..., L, 1): it is one "
             "number a query, shape (..., L); squeeze(-1) the column",
             "return out, lse.squeeze(-1)", "return out, lse"),
    # -- merge_attention ---------------------------------------------------------------------
    KnownBug("merge_attention", "plain-average",
             "looks like the two outputs are averaged: each part weighs by its share of the softmax "
             "mass, exp(lse_a - lse) and exp(lse_b - lse), with lse = logaddexp(lse_a, lse_b)",
             "return weight_a * out_a + weight_b * out_b, lse", "return (out_a + out_b) / 2, lse"),
    KnownBug("merge_attention", "lse-is-max",
             "looks like the merged log-sum-exp is the larger of the two; it is "
             "log(exp(lse_a) + exp(lse_b)), torch.logaddexp(lse_a, lse_b)",
             "lse = torch.logaddexp(lse_a, lse_b)", "lse = torch.maximum(lse_a, lse_b)"),
    KnownBug("merge_attention", "lse-summed",
             "looks like the two log-sum-exps are added: sums of exp add, so their logs combine "
             "as log(exp(lse_a) + exp(lse_b)), torch.logaddexp",
             "lse = torch.logaddexp(lse_a, lse_b)", "lse = lse_a + lse_b"),
    KnownBug("merge_attention", "exp-overflows",
             "looks like exp(lse) is computed directly: with scores of a few hundred it overflows "
             "to inf; torch.logaddexp(lse_a, lse_b) does the same without overflow",
             "lse = torch.logaddexp(lse_a, lse_b)", "lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))"),
    KnownBug("merge_attention", "weight-not-normalised",
             "looks like part A is weighed by exp(lse_a) instead of exp(lse_a - lse): each part's "
             "weight is its share of the total mass, and the two shares sum to 1",
             "weight_a = torch.exp(lse_a - lse)[..., None]", "weight_a = torch.exp(lse_a)[..., None]"),
)
