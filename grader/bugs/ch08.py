"""Known bugs of chapter 8: a tiny causal language model."""

from grader.bugs import KnownBug

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
             "for block in self.blocks:", "for block in self.blocks[:1]:"),
    KnownBug("TinyLM", "embedding-scaled",
             "looks like the token embedding is multiplied by sqrt(d_model) (as in the 2017 "
             "Transformer); this model adds tok_emb(tokens) and pos_emb(positions) as they are",
             "x = self.tok_emb(tokens) + self.pos_emb(positions)",
             "x = self.tok_emb(tokens) * self.tok_emb.embedding_dim ** 0.5 + self.pos_emb(positions)"),
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
             "(a tensor keeps its whole graph alive)",
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
)
