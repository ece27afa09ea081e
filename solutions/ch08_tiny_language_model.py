"""Chapter 8: capstone, a tiny causal language model from your own parts.

Fill in the body of each function and class (the lines that raise
NotImplementedError). Read chapters/08_tiny_language_model/README.md first;
grade your work with

    mha-course grade ch08

Conventions used in every exercise of this chapter:

* Tokens are integers ``0 .. vocab_size - 1`` (one a character of the
  chapter's ``text.txt``), in a ``(B, T)`` tensor; ``T <= context``.
* The model is pre-norm: each sub-layer reads ``LayerNorm(x)`` and its output
  is added to ``x`` (the residual stream).
* Attention is causal: position ``t`` sees positions ``0 .. t`` only, so the
  logits at ``t`` never depend on a later token.
* The grader loads weights by ``state_dict`` names: use exactly the
  attribute names the docstrings give (and no other parameters).
* Precision, the course's rule: a function returns floating results in the
  dtype of its floating inputs (here, of the model's parameters: float32).
  float32 and float64 inputs get float32's accuracy: inside, a function may
  compute in float32 or wider (computing float64 inputs in float32, as llama's
  ``.float()`` does, is allowed), and the checks compare float64 results at
  float32's tolerance. float16 and bfloat16 results are compared at those
  dtypes' looser tolerance; computing them in float32 inside is good practice.
  Each docstring's "Dtypes:" line says which dtypes the function is given.
* Devices: inputs come on the CPU or on a GPU; make any new tensor (a mask,
  positions) on the inputs' device (``device=x.device``).

You may not use ``nn.MultiheadAttention`` (nor its functional form): write
the attention yourself, as in chapters 3 and 4.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


class TransformerBlock(nn.Module):
    """A pre-norm decoder block: causal multi-head self-attention, then a
    feed-forward network, each added to its input.

    ``x = x + attention(ln1(x))`` then ``x = x + mlp(ln2(x))``, where the
    attention projects with ``qkv`` to queries, keys and values (in that
    order along the last dimension), splits them into ``num_heads`` heads of
    ``d_model // num_heads`` features (chapter 3), applies the causal
    ``softmax(q k^T / sqrt(d)) v`` per head, merges the heads and projects
    with ``proj``; and ``mlp`` is ``Linear(d_model, 4 d_model)``, ``GELU``
    (exact, ``nn.GELU()``'s default, not the tanh approximation),
    ``Linear(4 d_model, d_model)``. ``ln1`` and ``ln2`` are
    ``nn.LayerNorm(d_model)`` with its defaults (``eps=1e-5``).

    Parameters (``state_dict`` names): ``ln1.weight``, ``ln1.bias``,
    ``qkv.weight`` ``(3 D, D)``, ``qkv.bias``, ``proj.weight`` ``(D, D)``,
    ``proj.bias``, ``ln2.weight``, ``ln2.bias``, ``mlp.0.weight``
    ``(4 D, D)``, ``mlp.0.bias``, ``mlp.2.weight`` ``(D, 4 D)``,
    ``mlp.2.bias``.

    Args:
        d_model: features of each token, ``D``, a multiple of ``num_heads``.
        num_heads: attention heads ``H``.

    ``forward(x)``: ``x`` of shape ``(B, T, D)``, ``T`` from 1, gives shape
    ``(B, T, D)``.

    ``forward_with_cache(x, cache=None)``: the same block for ``T`` new
    tokens that come after ``T_past`` earlier ones whose keys and values are
    cached (chapter 4's ``attend_with_cache``). ``cache`` is None (no earlier
    token, ``T_past = 0``) or ``(k_cache, v_cache)``, each of shape
    ``(B, H, T_past, d)``: the keys and values of the earlier tokens, split
    into heads. The new tokens' keys and values are appended after the cached
    ones; new token ``i`` sits at position ``T_past + i`` and sees positions
    ``0 .. T_past + i`` (the causal mask's bottom-right corner, ``(T, T_past
    + T)``). Gives ``(output, (k, v))``: the new tokens' output ``(B, T, D)``,
    equal to the last ``T`` rows of ``forward`` on all ``T_past + T``
    inputs, and the cache with the new keys and values appended, each ``(B,
    H, T_past + T, d)``, the cached tokens first. The cache passed in is not
    modified (not in place either). ``forward(x)`` is
    ``forward_with_cache(x)`` without the cache: it may return
    ``self.forward_with_cache(x)[0]``.

    Dtypes: ``x`` (and the cache) in the dtype of the parameters (float32);
    the results have that dtype.
    """

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        # BEGIN SOLUTION
        self.num_heads = num_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        # END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        return self.forward_with_cache(x)[0]  # (B, T, D): one attention path for both
        # END SOLUTION

    def forward_with_cache(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        # BEGIN SOLUTION
        batch, length, d_model = x.shape
        head_dim = d_model // self.num_heads
        q, k, v = self.qkv(self.ln1(x)).split(d_model, dim=-1)  # 3 x (B, T, D)
        # (B, T, D) -> (B, T, H, d) -> (B, H, T, d), as chapter 3's split_heads
        q, k, v = (t.view(batch, length, self.num_heads, head_dim).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k = torch.cat([cache[0], k], dim=-2)  # (B, H, T_past + T, d): the past first
            v = torch.cat([cache[1], v], dim=-2)
        past = k.shape[-2] - length  # T_past, 0 without a cache
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (B, H, T, T_past + T)
        # New token i is position past + i: it sees keys 0 .. past + i, and the later ones are
        # -inf before the softmax (weight 0). Bottom-right: a plain triu(1) would hide the past.
        future = torch.ones(length, past + length, dtype=torch.bool, device=x.device).triu(past + 1)
        scores = scores.masked_fill(future, float("-inf"))
        heads = torch.softmax(scores, dim=-1) @ v  # (B, H, T, d)
        merged = heads.transpose(1, 2).reshape(batch, length, d_model)  # (B, T, D)
        x = x + self.proj(merged)
        x = x + self.mlp(self.ln2(x))
        return x, (k, v)  # (B, T, D), and the cache (B, H, T_past + T, d) each
        # END SOLUTION


class TinyLM(nn.Module):
    """A decoder-only language model: embeddings, blocks, a final norm, a head.

    ``x = tok_emb(tokens) + pos_emb(positions 0 .. T - 1)``, then each of
    the ``num_layers`` ``TransformerBlock``\\ s in ``blocks`` in turn, then
    ``ln_f``, then ``head`` (a ``Linear(d_model, vocab_size)``) gives the
    logits of the next token at every position.

    Parameters (``state_dict`` names): ``tok_emb.weight`` ``(V, D)``,
    ``pos_emb.weight`` ``(context, D)``, ``blocks.0. ...`` to
    ``blocks.{num_layers - 1}. ...`` (each a ``TransformerBlock``'s names),
    ``ln_f.weight``, ``ln_f.bias``, ``head.weight`` ``(V, D)``, ``head.bias``.

    Args:
        vocab_size: tokens ``V``.
        d_model, num_heads: as for ``TransformerBlock``.
        num_layers: blocks, ``>= 1``.
        context: the longest sequence, the rows of ``pos_emb``.

    ``forward(tokens)``: ``tokens`` of shape ``(B, T)`` (integers,
    ``1 <= T <= context``) gives logits of shape ``(B, T, V)``.

    ``forward_with_cache(tokens, cache=None)``: the logits of ``T`` new
    tokens that come after ``T_past`` earlier ones, from the blocks'
    ``forward_with_cache``. ``cache`` is None (``T_past = 0``) or a list with
    one ``(k_cache, v_cache)`` a block, in the order of ``blocks``, each of
    shape ``(B, H, T_past, d)``; ``T_past + T <= context``. The new tokens
    sit at positions ``T_past .. T_past + T - 1``: those are the rows of
    ``pos_emb`` they get. Gives ``(logits, cache)``: logits ``(B, T, V)``,
    equal to the last ``T`` rows of ``forward`` on all ``T_past + T``
    tokens, and the list of every block's grown cache, each ``(B, H, T_past
    + T, d)``. ``forward(tokens)`` may return
    ``self.forward_with_cache(tokens)[0]``.

    Dtypes: ``tokens`` int64; the logits (and the cache) have the
    parameters' dtype (float32).
    """

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int, context: int):
        super().__init__()
        # BEGIN SOLUTION
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, num_heads) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)
        # END SOLUTION

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        return self.forward_with_cache(tokens)[0]  # (B, T, V)
        # END SOLUTION

    def forward_with_cache(
        self, tokens: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        # BEGIN SOLUTION
        past = 0 if cache is None else cache[0][0].shape[-2]  # T_past: the cached keys' positions
        positions = torch.arange(past, past + tokens.shape[1], device=tokens.device)  # (T,)
        x = self.tok_emb(tokens) + self.pos_emb(positions)  # (B, T, D): (T, D) broadcasts over B
        grown = []
        for layer, block in enumerate(self.blocks):
            x, block_cache = block.forward_with_cache(x, None if cache is None else cache[layer])  # (B, T, D)
            grown.append(block_cache)  # (B, H, T_past + T, d) each
        return self.head(self.ln_f(x)), grown  # (B, T, V), one cache a block
        # END SOLUTION


def train(
    tokens: torch.Tensor,
    vocab_size: int,
    steps: int,
    context: int = 32,
    batch_size: int = 16,
    lr: float = 1e-2,
    seed: int = 0,
    d_model: int = 32,
    num_heads: int = 2,
    num_layers: int = 1,
) -> tuple[TinyLM, list[float]]:
    """Train a fresh ``TinyLM`` to predict the next token: the model, and the loss of every step.

    Seed PyTorch's generator with ``seed`` first (``torch.manual_seed``), so
    that the same arguments give the same losses; then build ``TinyLM(vocab_size, d_model, num_heads,
    num_layers, context)`` on the device of ``tokens`` and an
    ``torch.optim.AdamW`` with learning rate ``lr``. Each step: draw
    ``batch_size`` random windows of ``context + 1`` consecutive tokens
    (with PyTorch's generator, ``torch.randint``, so the seed decides them); the
    first ``context`` are the input, the last ``context`` (shifted by one)
    the targets; the loss is the cross-entropy of the logits against the
    targets, averaged over every position; zero the gradients, backpropagate
    and step.

    Dtypes: ``tokens`` int64; the model is float32 and the losses are Python
    floats.

    Args:
        tokens: the training text as token ids, shape ``(N,)``, ``N > context + 1``.
        vocab_size: tokens ``V``.
        steps: optimizer steps.
        context, batch_size, lr, seed, d_model, num_heads, num_layers: as named.

    Returns:
        ``(model, losses)``: the trained ``TinyLM`` itself (not a copy), and
        a list of ``steps`` Python floats (``loss.item()``), the loss before
        each step.
    """
    # BEGIN SOLUTION
    torch.manual_seed(seed)
    model = TinyLM(vocab_size, d_model, num_heads, num_layers, context).to(tokens.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    offsets = torch.arange(context + 1, device=tokens.device)  # (context + 1,)
    losses = []
    for _ in range(steps):
        starts = torch.randint(len(tokens) - context, (batch_size, 1), device=tokens.device)  # (B, 1)
        windows = tokens[starts + offsets]  # (B, context + 1)
        inputs, targets = windows[:, :-1], windows[:, 1:]  # (B, T) each: the target is the next token
        logits = model(inputs)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1))  # over B * T positions
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # a float, not the tensor: keeping it would keep its graph
    return model, losses
    # END SOLUTION


def generate(model: TinyLM, prompt: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Continue ``prompt`` by ``num_tokens`` tokens, greedily, with the KV cache.

    Run the prompt through ``model.forward_with_cache`` once (no cache yet);
    then, ``num_tokens`` times: take the logits of the newest position, pick
    the token with the largest one (``argmax``, no sampling), and run that
    one token through ``model.forward_with_cache`` with the cache the last
    call returned, which grows by one position a step. This must give what
    running ``model`` on the whole sequence again at every step gives, at a
    fraction of the cost. No gradients are needed (``torch.no_grad()``).

    Args:
        model: a ``TinyLM`` (its ``forward_with_cache`` is all this uses).
        prompt: the first tokens, shape ``(B, T0)``, int64, ``T0 >= 1``.
        num_tokens: how many tokens to add, ``N >= 1``;
            ``T0 + N <= context``.

    Returns:
        ``(tokens, logits)``: ``tokens`` ``(B, T0 + N)``, the prompt then the
        new tokens; ``logits`` ``(B, N, V)``, for each new token the logits
        it was chosen from (those of the position before it).

    Dtypes: ``prompt`` int64; ``tokens`` int64; ``logits`` have the model's
    dtype (float32).
    """
    # BEGIN SOLUTION
    with torch.no_grad():  # generating needs no gradients: no graph is kept
        logits, cache = model.forward_with_cache(prompt)  # (B, T0, V): the whole prompt at once
        tokens, chosen = prompt, []
        for _ in range(num_tokens):
            last = logits[:, -1]  # (B, V): the newest position predicts the next token
            next_token = last.argmax(dim=-1, keepdim=True)  # (B, 1): greedy
            tokens = torch.cat([tokens, next_token], dim=1)  # (B, T + 1)
            chosen.append(last)
            # One new token at position T_past = cache[0][0].shape[-2]; the cache grows by one.
            logits, cache = model.forward_with_cache(next_token, cache)  # (B, 1, V)
    return tokens, torch.stack(chosen, dim=1)  # (B, T0 + N), (B, N, V)
    # END SOLUTION


class RoPETransformerBlock(TransformerBlock):
    """Optional, no points: ``TransformerBlock`` with rotary position
    embeddings (chapter 5) on its queries and keys. Graded when you write it;
    left as it is, it costs nothing.

    The same block, parameters and ``state_dict`` names as
    ``TransformerBlock`` (RoPE has none of its own), except that after the
    heads are split, each head's queries and keys are rotated by their
    token's position, as chapter 5's ``apply_rope``: features ``(2k, 2k + 1)``
    of a head of width ``d`` turn by the angle ``position * theta ** (-2k /
    d)`` (adjacent pairs, the angles in float32). The values are not rotated.
    A model built from these blocks needs no ``pos_emb``: the scores depend
    on the distance between two positions only.

    Args:
        d_model, num_heads: as for ``TransformerBlock``; ``d = d_model //
            num_heads`` is even.
        theta: the base of the frequencies.

    ``__init__`` and ``forward`` are given: the first keeps ``self.theta``
    and ``self.head_dim`` (``d``), whatever your ``TransformerBlock`` calls
    its own attributes. Write ``forward_with_cache``.

    ``forward(x)``: ``x`` ``(B, T, D)``, at positions ``0 .. T - 1``, gives
    ``(B, T, D)``.

    ``forward_with_cache(x, cache=None)``: as ``TransformerBlock``'s; the new
    tokens sit at positions ``T_past .. T_past + T - 1`` and are rotated
    there. The cache holds keys already rotated (as Hugging Face's and
    llama's caches do), so cached keys are never rotated again: ``(k, v)``,
    each ``(B, H, T_past + T, d)``, the rotated keys and the values.

    Dtypes: ``x`` (and the cache) in the dtype of the parameters (float32);
    the results have that dtype.
    """

    def __init__(self, d_model: int, num_heads: int, theta: float = 10000.0):
        super().__init__(d_model, num_heads)
        self.theta = theta
        self.head_dim = d_model // num_heads  # d: whatever your TransformerBlock calls its head count

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_cache(x)[0]  # (B, T, D)

    def forward_with_cache(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        # BEGIN SOLUTION
        batch, length, d_model = x.shape
        head_dim = self.head_dim
        q, k, v = self.qkv(self.ln1(x)).split(d_model, dim=-1)  # 3 x (B, T, D)
        q, k, v = (t.view(batch, length, -1, head_dim).transpose(1, 2) for t in (q, k, v))  # (B, H, T, d)
        start = 0 if cache is None else cache[0].shape[-2]  # T_past: the new tokens come after it
        positions = torch.arange(start, start + length, device=x.device)  # (T,)
        frequencies = self.theta ** (-torch.arange(0, head_dim, 2, device=x.device) / head_dim)  # (d/2,)
        angles = positions[:, None].float() * frequencies  # (T, d/2), float32 as chapter 5

        def rotate(t):  # (B, H, T, d): pairs (2k, 2k + 1) turned by angles[:, k]
            even, odd = t.unflatten(-1, (-1, 2)).unbind(-1)  # (B, H, T, d/2) each
            cos, sin = angles.cos().to(t.dtype), angles.sin().to(t.dtype)
            return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)

        q, k = rotate(q), rotate(k)  # the values keep their features
        if cache is not None:  # the cached keys were rotated when they were new
            k = torch.cat([cache[0], k], dim=-2)  # (B, H, T_past + T, d)
            v = torch.cat([cache[1], v], dim=-2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (B, H, T, T_past + T)
        hidden = torch.ones(length, start + length, dtype=torch.bool, device=x.device).triu(start + 1)
        heads = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ v  # (B, H, T, d)
        x = x + self.proj(heads.transpose(1, 2).reshape(batch, length, d_model))
        x = x + self.mlp(self.ln2(x))
        return x, (k, v)  # (B, T, D), and the cache (B, H, T_past + T, d) each
        # END SOLUTION


def sample_next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """Optional, no points: draw the next token of each row at random, as
    Hugging Face's ``generate(do_sample=True)`` does, instead of ``argmax``.
    Graded when you write it; left as it is, it costs nothing.

    The three filters apply in this order, each to what the last left:

    1. temperature: the logits divided by ``temperature`` (below 1 sharpens
       the distribution towards the argmax; above 1 flattens it);
    2. top-k: keep the ``top_k`` largest logits of each row, set the others
       to ``-inf`` (a logit equal to the k-th largest is kept);
    3. top-p (nucleus sampling): of the tokens left, by the softmax of what
       is left, keep the most likely ones, in order, until their
       probabilities add up to ``top_p`` or more: the token that reaches
       ``top_p`` is kept, and so is the most likely token always.

    Then draw one token a row from the softmax of what is left, with
    ``torch.multinomial`` and a generator seeded with ``seed`` on the
    logits' device: ``torch.Generator(logits.device).manual_seed(seed)``.
    The same seed gives the same tokens.

    Args:
        logits: ``(B, V)``, the newest position's logits, as ``generate``
            takes them.
        temperature: ``> 0``.
        top_k: ``1 <= top_k <= V``, or None: no top-k filter.
        top_p: ``0 < top_p <= 1``, or None: no top-p filter.
        seed: seeds the draw.

    Returns:
        ``(B,)`` int64: one token a row, ``0 .. V - 1``.

    Dtypes: ``logits`` float32 or float64.
    """
    # BEGIN SOLUTION
    logits = logits / temperature  # (B, V)
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest of each row
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        ranked, order = logits.sort(dim=-1, descending=True)  # (B, V) each, most likely first
        probabilities = ranked.softmax(dim=-1)  # (B, V), of what top-k left
        above = probabilities.cumsum(dim=-1) - probabilities  # (B, V): mass of the tokens ranked above
        dropped = above >= top_p  # (B, V): top_p was reached before this token
        logits = logits.masked_fill(dropped.scatter(-1, order, dropped), float("-inf"))  # back to vocab order
    generator = torch.Generator(device=logits.device).manual_seed(seed)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]  # (B,)
    # END SOLUTION
