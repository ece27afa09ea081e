"""Known bugs of chapter 8: a tiny causal language model."""

from grader.chapters import KnownBug

BUGS = (
    # -- TransformerBlock ----------------------------------------------------------------------
    KnownBug("TransformerBlock", "no-causal-mask",
             "looks like the causal mask is missing: every position sees the whole sequence, the "
             "tokens it must predict included; set the scores of later positions to -inf before "
             "the softmax",
             'scores = scores.masked_fill(future, float("-inf"))', "scores = scores"),
    KnownBug("TransformerBlock", "no-scale",
             "looks like the scores are not divided by sqrt(d), d = d_model // num_heads, the "
             "features of one head (not of the whole model)",
             "scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)", "scores = q @ k.transpose(-2, -1)"),
    KnownBug("TransformerBlock", "post-norm",
             "looks like the block normalises after adding (post-norm, the 2017 Transformer); this "
             "chapter's block is pre-norm: x = x + mlp(ln2(x)), the norm on the sub-layer's input",
             "x = x + self.mlp(self.ln2(x))", "x = self.ln2(x + self.mlp(x))"),
    KnownBug("TransformerBlock", "no-attention-residual",
             "looks like the attention's output replaces x instead of being added to it: "
             "x = x + proj(attention(ln1(x)))",
             "x = x + self.proj(merged)", "x = self.proj(merged)"),
    KnownBug("TransformerBlock", "merge-without-transpose",
             "looks like the heads are merged without moving the head dimension back: (B, H, T, d) "
             "must become (B, T, H, d) (transpose(1, 2)) before the reshape to (B, T, D)",
             "merged = heads.transpose(1, 2).reshape(batch, length, d_model)",
             "merged = heads.reshape(batch, length, d_model)"),
    KnownBug("TransformerBlock", "cache-ignored",
             "looks like forward_with_cache leaves the cache out: the new tokens attend only to "
             "each other, and the cache returned holds only their keys; append them after the "
             "cached ones first (torch.cat along the token axis, dim=-2), then attend over all",
             "        if cache is not None:\n", "        if False:\n"),
    KnownBug("TransformerBlock", "cache-not-appended",
             "looks like the cache returned is the one passed in: it never grows; return the "
             "cached keys and values with the new tokens' appended, (B, H, T_past + T, d) each",
             "return x, (k, v)", "return x, cache"),
    KnownBug("TransformerBlock", "top-left-mask",
             "looks like the causal mask of forward_with_cache is the top-left corner: new token "
             "i is at position T_past + i and sees keys 0 .. T_past + i; a (T, T_past + T) mask "
             "hides the keys after column T_past + i, triu(T_past + 1), not triu(1) (and "
             "F.scaled_dot_product_attention's is_causal=True is top-left too: pass the mask)",
             ".triu(past + 1)", ".triu(1)"),
    KnownBug("TransformerBlock", "new-keys-first",
             "looks like the new keys and values are put before the cached ones; the cache keeps "
             "the tokens in order, the past first: torch.cat([cache, new], dim=-2)",
             "k = torch.cat([cache[0], k], dim=-2)  # (B, H, T_past + T, d): the past first\n"
             "            v = torch.cat([cache[1], v], dim=-2)",
             "k = torch.cat([k, cache[0]], dim=-2)\n            v = torch.cat([v, cache[1]], dim=-2)"),
    # -- TinyLM ----------------------------------------------------------------------------------
    KnownBug("TinyLM", "no-position-embedding",
             "looks like the position embedding is not added: attention alone does not know the "
             "order of the tokens; x = tok_emb(tokens) + pos_emb(arange(T))",
             "x = self.tok_emb(tokens) + self.pos_emb(positions)", "x = self.tok_emb(tokens)"),
    KnownBug("TinyLM", "no-final-norm",
             "looks like ln_f is not applied before the head: with pre-norm blocks the residual "
             "stream is never normalised otherwise; logits = head(ln_f(x))",
             "return self.head(self.ln_f(x))", "return self.head(x)"),
    KnownBug("TinyLM", "first-block-only",
             "looks like only the first block runs: every block of self.blocks, in order, each on "
             "the previous one's output",
             "enumerate(self.blocks)", "enumerate(self.blocks[:1])"),
    KnownBug("TinyLM", "embedding-scaled",
             "looks like the token embedding is multiplied by sqrt(d_model) (as in the 2017 "
             "Transformer); this model adds tok_emb(tokens) and pos_emb(positions) as they are",
             "x = self.tok_emb(tokens) + self.pos_emb(positions)",
             "x = self.tok_emb(tokens) * self.tok_emb.embedding_dim ** 0.5 + self.pos_emb(positions)"),
    KnownBug("TinyLM", "positions-restart-at-0",
             "looks like the new tokens get positions 0 .. T - 1 again; after T_past cached "
             "tokens they are at T_past .. T_past + T - 1: pos_emb(arange(T_past, T_past + T))",
             "torch.arange(past, past + tokens.shape[1], device=tokens.device)",
             "torch.arange(tokens.shape[1], device=tokens.device)"),
    KnownBug("TinyLM", "past-length-from-heads-axis",
             "looks like T_past is read from the wrong axis of the cache: a cached key is "
             "(B, H, T_past, d), so T_past = k.shape[-2] (shape[1] is the number of heads)",
             "cache[0][0].shape[-2]", "cache[0][0].shape[1]"),
    KnownBug("TinyLM", "one-cache-for-every-block",
             "looks like every block gets the first block's cache: each block has its own keys "
             "and values, cache[i] for blocks[i]",
             "None if cache is None else cache[layer]", "None if cache is None else cache[0]"),
    KnownBug("TinyLM", "cache-not-appended",
             "looks like forward_with_cache returns the cache passed in, not the blocks' grown "
             "ones: return the list of every block's (k, v) as its forward_with_cache returned it",
             "return self.head(self.ln_f(x)), grown", "return self.head(self.ln_f(x)), cache"),
    # -- RoPETransformerBlock (optional) -------------------------------------------------------
    KnownBug("RoPETransformerBlock", "rope-positions-from-0",
             "looks like the new tokens are rotated at positions 0 .. T - 1 again; after T_past "
             "cached tokens they sit at T_past .. T_past + T - 1, and their queries and keys turn "
             "by those positions (T_past = the cached keys' shape[-2])",
             "start = 0 if cache is None else cache[0].shape[-2]", "start = 0"),
    KnownBug("RoPETransformerBlock", "cached-keys-rotated-again",
             "looks like the keys are rotated after the cached ones are put in front: those were "
             "rotated when they were new, and turn a second time; rotate the new keys, then append "
             "them to the cache",
             "        q, k = rotate(q), rotate(k)  # the values keep their features\n"
             "        if cache is not None:  # the cached keys were rotated when they were new\n"
             "            k = torch.cat([cache[0], k], dim=-2)  # (B, H, T_past + T, d)\n",
             "        if cache is not None:\n"
             "            k = torch.cat([cache[0], k], dim=-2)\n"
             "        angles = torch.arange(k.shape[-2], device=x.device)[:, None].float() * frequencies\n"
             "        k = rotate(k)\n"
             "        angles = positions[:, None].float() * frequencies\n"
             "        q = rotate(q)\n"
             "        if cache is not None:\n"),
    KnownBug("RoPETransformerBlock", "values-rotated",
             "looks like the values are rotated too; RoPE turns the queries and keys, whose dot "
             "product then depends on the distance between positions; the values are left alone",
             "q, k = rotate(q), rotate(k)", "q, k, v = rotate(q), rotate(k), rotate(v)"),
    KnownBug("RoPETransformerBlock", "keys-not-rotated",
             "looks like only the queries are rotated; rotate the keys too (by their own "
             "positions): only then does q . k depend on the distance between the two positions",
             "q, k = rotate(q), rotate(k)", "q = rotate(q)"),
    KnownBug("RoPETransformerBlock", "rope-half-pairs",
             "looks like the pairs are (k, k + d/2), the rotate_half convention; this block turns "
             "adjacent pairs (2k, 2k + 1), as chapter 5's apply_rope",
             "            even, odd = t.unflatten(-1, (-1, 2)).unbind(-1)  # (B, H, T, d/2) each\n",
             "            even, odd = t.chunk(2, dim=-1)\n"
             "            cos, sin = angles.cos().to(t.dtype), angles.sin().to(t.dtype)\n"
             "            return torch.cat([even * cos - odd * sin, even * sin + odd * cos], dim=-1)\n"),
    KnownBug("RoPETransformerBlock", "rope-over-model-width",
             "looks like the frequencies are spread over the model's width D (theta ** (-2k / D)); "
             "each head is rotated on its own, over its d = D / H features: theta ** (-2k / d)",
             "torch.arange(0, head_dim, 2, device=x.device) / head_dim)",
             "torch.arange(0, head_dim, 2, device=x.device) / d_model)"),
    KnownBug("RoPETransformerBlock", "theta-ignored",
             "looks like the base of the frequencies is always 10000; use the theta the block "
             "was built with",
             "frequencies = self.theta **", "frequencies = 10000.0 **"),
    # -- train -----------------------------------------------------------------------------------
    KnownBug("train", "targets-not-shifted",
             "looks like the model sees the token it must predict: either the targets are the "
             "inputs themselves (they are the window shifted by one, windows[:, 1:]), or the "
             "block has no causal mask",
             "inputs, targets = windows[:, :-1], windows[:, 1:]",
             "inputs, targets = windows[:, :-1], windows[:, :-1]"),
    KnownBug("train", "no-optimizer-step",
             "looks like optimizer.step() is never called: the gradients are computed but no "
             "weight changes, and the loss stays near ln(V)",
             "        optimizer.step()\n", ""),
    KnownBug("train", "gradients-not-zeroed",
             "looks like the gradients are not zeroed before backward: they add up from step to "
             "step and the steps grow wild; call optimizer.zero_grad() each step",
             "        optimizer.zero_grad()\n", ""),
    KnownBug("train", "not-seeded",
             "looks like torch.manual_seed(seed) is not called first: the same seed must give the "
             "same initial weights, the same batches and so the same losses",
             "    torch.manual_seed(seed)\n", ""),
    KnownBug("train", "loss-kept-as-tensor",
             "looks like the loss tensors themselves are kept: append loss.item(), a Python float "
             "(a tensor holds on to the graph that made it)",
             "losses.append(loss.item())", "losses.append(loss)"),
    KnownBug("train", "model-and-losses-swapped",
             "looks like the losses come first: train returns (model, losses), the model first",
             "return model, losses", "return losses, model"),
    KnownBug("train", "fresh-model-returned",
             "looks like the model returned is not the one the loop trained (a new TinyLM, or a "
             "copy made before training): return the very model whose parameters the optimizer "
             "stepped",
             "return model, losses",
             "return TinyLM(vocab_size, d_model, num_heads, num_layers, context), losses"),
    # -- generate --------------------------------------------------------------------------------
    KnownBug("generate", "first-position-logits",
             "looks like the first new token is chosen from the prompt's first position; the "
             "next token is predicted by the newest position, logits[:, -1]",
             "last = logits[:, -1]", "last = logits[:, 0]"),
    KnownBug("generate", "cache-not-carried",
             "looks like each step runs without the cache the last call returned: the new token "
             "then sees only itself, at position 0; pass the cache on, "
             "model.forward_with_cache(next_token, cache)",
             "model.forward_with_cache(next_token, cache)", "model.forward_with_cache(next_token)"),
    KnownBug("generate", "whole-sequence-with-cache",
             "looks like the whole sequence is run again with the cache: the cache already holds "
             "every earlier token, so each step runs only the newest one, (B, 1), and the "
             "positions soon run past the context",
             "model.forward_with_cache(next_token, cache)", "model.forward_with_cache(tokens, cache)",
             error=r"index out of range"),
    KnownBug("generate", "prompt-dropped",
             "looks like only the new tokens are returned; tokens is (B, T0 + N): the prompt, then "
             "the new tokens",
             "return tokens, torch.stack(chosen, dim=1)",
             "return tokens[:, prompt.shape[1]:], torch.stack(chosen, dim=1)"),
    KnownBug("generate", "next-token-without-batch-axis",
             "looks like the next token has lost its position axis: argmax(dim=-1) of (B, V) "
             "gives (B,); keep it (B, 1) (keepdim=True) to append it to the tokens and to run it",
             "last.argmax(dim=-1, keepdim=True)", "last.argmax(dim=-1)",
             error=r"Tensors must have same number of dimensions"),
    # -- sample_next_token (optional) ---------------------------------------------------------
    KnownBug("sample_next_token", "temperature-multiplied",
             "looks like the logits are multiplied by the temperature; they are divided by it, so "
             "that a temperature below 1 sharpens the distribution and one above 1 flattens it",
             "logits = logits / temperature", "logits = logits * temperature"),
    KnownBug("sample_next_token", "top-k-keeps-one-too-few",
             "looks like top-k keeps k - 1 tokens: the k-th largest logit is kept too (remove only "
             "the logits below it, < and not <=)",
             "logits < kth", "logits <= kth"),
    KnownBug("sample_next_token", "top-p-drops-the-crossing-token",
             "looks like top-p removes the token whose probability takes the running sum to top_p; "
             "keep the tokens until the sum reaches top_p, that one included (remove a token when "
             "the tokens ranked above it already hold top_p)",
             "above = probabilities.cumsum(dim=-1) - probabilities", "above = probabilities.cumsum(dim=-1)"),
    KnownBug("sample_next_token", "top-p-from-the-least-likely",
             "looks like top-p ranks the tokens from the least likely up, and so keeps the unlikely "
             "ones; rank them from the most likely down (sort descending) and keep those until their "
             "probabilities add up to top_p",
             "ranked, order = logits.sort(dim=-1, descending=True)",
             "ranked, order = logits.sort(dim=-1, descending=False)"),
    KnownBug("sample_next_token", "greedy",
             "looks like the token with the largest logit is taken every time (argmax): sampling draws "
             "each token with its probability, torch.multinomial(probabilities, 1, generator=...)",
             "torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]", "logits.argmax(dim=-1)"),
    KnownBug("sample_next_token", "seed-ignored",
             "looks like the seed is not used: the generator is seeded with a constant, so every seed "
             "draws the same tokens; seed it with the seed argument",
             "torch.Generator(device=logits.device).manual_seed(seed)",
             "torch.Generator(device=logits.device).manual_seed(0)"),
)
