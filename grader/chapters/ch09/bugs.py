"""Known bugs of chapter 9: the backward pass of tiled attention.

Each is an edit of the reference solution (``old`` to ``new``) with the hint
a student reads when their answer matches it; its lesson's Pitfalls section
names it in a ``<!-- known bugs: ... -->`` tag.
"""

from grader.chapters import KnownBug

BUGS = (
    # -- FlashAttentionFunction ------------------------------------------------------------
    # First: its checks call the given flash_attention_gradients, whose lookalikes try the
    # chapter's bugs in this order, and causal-not-passed-on gives the gradients of
    # flash_attention_backward's mask-forgotten-in-backward (the class's mistake, where the
    # class is graded).
    KnownBug("FlashAttentionFunction", "saves-the-weights",
             "looks like forward saves the (L, S) attention weights for backward, as autograd does "
             "for plain attention: that is the memory FlashAttention saves; save q, k, v, out and "
             "lse, and let backward rebuild the weights block by block",
             "ctx.save_for_backward(q, k, v, out, lse)",
             "ctx.save_for_backward(q, k, v, out, lse)\n"
             "        ctx.weights = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) - lse[..., None])"),
    KnownBug("FlashAttentionFunction", "causal-not-passed-on",
             "looks like backward calls flash_attention_backward without the causal flag forward "
             "was given: keep it on ctx (ctx.causal = causal) and pass it on",
             "causal=ctx.causal,", ""),
    KnownBug("FlashAttentionFunction", "out-and-grad-out-swapped",
             "looks like out and grad_out are passed to flash_attention_backward in each other's "
             "place: the saved output is O, the argument backward receives is dO",
             "q, k, v, out, lse, grad_out, causal", "q, k, v, grad_out, lse, out, causal"),
    KnownBug("FlashAttentionFunction", "dq-dk-swapped",
             "looks like backward returns dk where dq goes and dq where dk goes: one gradient for "
             "each argument of forward, in forward's order (q, k, v, causal, block_size)",
             "return dq, dk, dv, None, None", "return dk, dq, dv, None, None",
             error=r"returned an invalid gradient at index 0"),
    KnownBug("FlashAttentionFunction", "too-few-gradients",
             "looks like backward returns three gradients: it returns one for each argument of "
             "forward, None for causal and block_size: (dq, dk, dv, None, None)",
             "return dq, dk, dv, None, None", "return dq, dk, dv",
             error=r"returned an incorrect number of gradients"),
    KnownBug("FlashAttentionFunction", "no-gradient-for-v",
             "looks like backward returns None for v: dv = P^T dO, one of the three gradients "
             "flash_attention_backward gives",
             "return dq, dk, dv, None, None", "return dq, dk, None, None, None"),
    # -- flash_attention_forward -----------------------------------------------------------
    KnownBug("flash_attention_forward", "whole-score-matrix",
             "looks like the whole (L, S) score matrix is built at once: right numbers, but the "
             "memory FlashAttention saves is spent; take the keys block_size at a time, and keep "
             "only (L, block_size) scores",
             "for start in range(0, num_keys, block_size):\n"
             "        end = min(start + block_size, num_keys)",
             "for start in range(0, num_keys, num_keys):\n"
             "        end = num_keys"),
    KnownBug("flash_attention_forward", "output-not-rescaled",
             "looks like the running output is not rescaled when the max grows: acc holds values "
             "weighted by exp(score - m_old), so multiply it by exp(m_old - m_new), as the sum",
             "acc = acc * rescale + p @ v[..., start:end, :]", "acc = acc + p @ v[..., start:end, :]"),
    KnownBug("flash_attention_forward", "sum-not-rescaled",
             "looks like the running sum l is not rescaled when the max grows: multiply it by "
             "exp(m_old - m_new) before adding the block's sum, as the output",
             "l = l * rescale + p.sum(dim=-1, keepdim=True)", "l = l + p.sum(dim=-1, keepdim=True)"),
    KnownBug("flash_attention_forward", "causal-top-left",
             "looks like the causal mask is aligned top-left (query i sees keys 0 .. i); with L "
             "queries and S keys, query i is at position i + S - L (bottom-right, chapter 4)",
             "[:, None] + (num_keys - num_queries)", "[:, None]"),
    KnownBug("flash_attention_forward", "no-scale",
             "looks like the scores are not multiplied by 1 / sqrt(d)",
             "scores = q @ k[..., start:end, :].transpose(-2, -1) * scale",
             "scores = q @ k[..., start:end, :].transpose(-2, -1)"),
    KnownBug("flash_attention_forward", "lse-is-max",
             "looks like lse is the running max m: l sums exp(score - m), so the log of the sum of "
             "exp(score) is m + log l, larger than m by log l (up to log S)",
             "lse = m + torch.log(l)", "lse = m"),
    KnownBug("flash_attention_forward", "nan-for-queries-without-keys",
             "looks like a query with no key to see (causal, L > S) divides 0 by 0; its output must "
             "be 0: divide by 1 where l is 0",
             "out = acc / l.masked_fill(l == 0, 1.0)", "out = acc / l"),
    # -- flash_attention_backward ----------------------------------------------------------
    KnownBug("flash_attention_backward", "autograd-through-naive-attention",
             "looks like the gradients come from autograd through attention recomputed whole: "
             "right numbers, but autograd keeps the (L, S) scores and weights, the memory tiling "
             "saves; rebuild each block's weights from lse and apply dS = P * (dP - D) block by block",
             "delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (..., L, 1)",
             "with torch.enable_grad():\n"
             "        leaves = [tensor.detach().requires_grad_(True) for tensor in (q, k, v)]\n"
             "        scores = leaves[0] @ leaves[1].transpose(-2, -1) * scale\n"
             "        if causal:\n"
             "            visible = torch.ones(num_queries, num_keys, dtype=torch.bool, device=q.device)\n"
             "            scores = scores.masked_fill(~visible.tril(num_keys - num_queries), float(\"-inf\"))\n"
             "        weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))\n"
             "        weights = weights / weights.sum(dim=-1, keepdim=True)\n"
             "        return torch.autograd.grad(((weights @ leaves[2]) * grad_out).sum(), leaves)\n"
             "    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (..., L, 1)"),
    KnownBug("flash_attention_backward", "no-delta",
             "looks like dS is P * dP: the softmax's gradient subtracts, for each query, "
             "D = rowsum(dO * O) (which equals rowsum(P * dP)): dS = P * (dP - D)",
             "ds = p * (dp - delta)", "ds = p * dp"),
    KnownBug("flash_attention_backward", "weights-not-normalised",
             "looks like the weights are rebuilt as exp(scores), without subtracting lse: "
             "P = exp(s - lse) is the forward's softmax, each row summing to 1",
             "p = torch.exp(scores - lse)", "p = torch.exp(scores)"),
    KnownBug("flash_attention_backward", "dq-overwritten",
             "looks like dq keeps only the last block of keys: every block adds dS K / sqrt(d) to "
             "it (dq = dq + ...), while dk and dv of a block come whole from that block",
             "dq = dq + ds @ k_block * scale", "dq = ds @ k_block * scale"),
    KnownBug("flash_attention_backward", "dq-not-scaled",
             "looks like dq misses the factor 1 / sqrt(d): the scores are q k^T / sqrt(d), so "
             "dq = dS K / sqrt(d), as dk = dS^T Q / sqrt(d)",
             "dq = dq + ds @ k_block * scale", "dq = dq + ds @ k_block"),
    KnownBug("flash_attention_backward", "mask-forgotten-in-backward",
             "looks like the weights rebuilt in backward leave the causal mask out: masked keys "
             "get exp(s - lse) > 0; mask the scores as the forward pass did",
             "scores = scores.masked_fill(keys > positions, float(\"-inf\"))  # (..., L, block)",
             "scores = scores  # (..., L, block)"),
    KnownBug("flash_attention_backward", "nan-for-queries-without-keys",
             "looks like a query with no key to see (causal, L > S) gets NaN: its lse is -inf, and "
             "exp(-inf - (-inf)) is NaN; its weights must be 0 (take lse +inf there, or mask the row)",
             "lse = lse.masked_fill(torch.isneginf(lse), float(\"inf\"))[..., None]", "lse = lse[..., None]"),
)
