"""Chapter 8's oracles: a pre-norm transformer block and the tiny language
model written with PyTorch's functions (``F.layer_norm``, ``F.linear``,
``F.scaled_dot_product_attention`` with ``is_causal=True``, ``F.gelu``,
``F.embedding``) on the weights of a state dict; the keys and values each
block computes (what a KV cache holds); greedy generation that runs the
whole sequence again at every step (no cache); the text cut into
windows with their next tokens; and the distribution a sampler draws from
(temperature, top-k, top-p), computed as Hugging Face's logits warpers do.

Shapes: x ``(B, T, D)`` with ``D = H * d``; tokens ``(B, T)`` int64; logits
``(B, T, V)``. A state in the course's names (the docstrings' ``state_dict``):
a block's ``ln1``, ``qkv (3D, D)``, ``proj (D, D)``, ``ln2``, ``mlp.0 (4D,
D)`` and ``mlp.2 (D, 4D)``, each with ``.weight`` and ``.bias``; the model's
``tok_emb (V, D)``, ``pos_emb (context, D)``, ``blocks.{i}.`` + a block's
names, ``ln_f`` and ``head (V, D)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["block", "block_keys_values", "greedy", "model", "model_keys_values", "rope_block",
           "rope_block_keys_values", "sampling_distribution", "text_windows"]


def _heads(state, num_heads, x, prefix):
    """``(q, k, v)``, ``(B, H, T, d)`` each: ``qkv(ln1(x))`` split into heads."""
    batch, length, d_model = x.shape
    normed = F.layer_norm(x, (d_model,), state[prefix + "ln1.weight"], state[prefix + "ln1.bias"])
    qkv = F.linear(normed, state[prefix + "qkv.weight"], state[prefix + "qkv.bias"])  # (B, T, 3 D)
    return tuple(t.reshape(batch, length, num_heads, -1).transpose(1, 2) for t in qkv.split(d_model, dim=-1))


def block_keys_values(state, num_heads, x, prefix=""):
    """``(k, v)``, ``(B, H, T, d)`` each: the keys and values the block computes
    for the inputs ``x`` ``(B, T, D)``, one position at a time (what its KV
    cache holds after those positions)."""
    _, k, v = _heads(state, num_heads, x, prefix)
    return k, v


def block(state, num_heads, x, prefix=""):
    """``x + attn(ln1(x))``, then ``+ mlp(ln2(.))``: ``(B, T, D)`` to ``(B, T, D)``,
    with the weights named ``prefix + name`` in ``state``."""
    def w(name):
        return state[prefix + name]

    batch, length, d_model = x.shape
    q, k, v = _heads(state, num_heads, x, prefix)  # (B, H, T, d) each
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, d)
    x = x + F.linear(heads.transpose(1, 2).reshape(batch, length, d_model), w("proj.weight"), w("proj.bias"))
    hidden = F.gelu(F.linear(F.layer_norm(x, (d_model,), w("ln2.weight"), w("ln2.bias")),
                             w("mlp.0.weight"), w("mlp.0.bias")))  # (B, T, 4 D)
    return x + F.linear(hidden, w("mlp.2.weight"), w("mlp.2.bias"))


def _rotated(t, theta):
    """``t`` ``(B, H, T, d)`` at positions ``0 .. T - 1``, pairs ``(2k, 2k + 1)``
    rotated as complex numbers ``t[2k] + i t[2k+1]`` times ``e^(i p theta^(-2k/d))``
    (Meta's ``apply_rotary_emb``)."""
    length, head_dim = t.shape[-2:]
    frequencies = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (d/2,)
    turns = torch.polar(torch.ones(length, head_dim // 2, dtype=torch.float64),
                        torch.outer(torch.arange(length, dtype=torch.float64), frequencies))  # (T, d/2)
    pairs = torch.view_as_complex(t.double().reshape(*t.shape[:-1], -1, 2).contiguous())  # (B, H, T, d/2)
    return torch.view_as_real(pairs * turns).flatten(-2).to(t.dtype)


def rope_block_keys_values(state, num_heads, theta, x):
    """``(k, v)``, ``(B, H, T, d)`` each: what a RoPE block's cache holds after
    the inputs ``x`` ``(B, T, D)``, the keys rotated by their positions."""
    _, k, v = _heads(state, num_heads, x, "")
    return _rotated(k, theta), v


def rope_block(state, num_heads, theta, x):
    """The block with its queries and keys rotated by their positions ``0 ..
    T - 1`` (no ``pos_emb``): ``(B, T, D)`` to ``(B, T, D)``."""
    batch, length, d_model = x.shape
    q, k, v = _heads(state, num_heads, x, "")  # (B, H, T, d) each
    heads = F.scaled_dot_product_attention(_rotated(q, theta), _rotated(k, theta), v, is_causal=True)
    x = x + F.linear(heads.transpose(1, 2).reshape(batch, length, d_model), state["proj.weight"], state["proj.bias"])
    hidden = F.gelu(F.linear(F.layer_norm(x, (d_model,), state["ln2.weight"], state["ln2.bias"]),
                             state["mlp.0.weight"], state["mlp.0.bias"]))  # (B, T, 4 D)
    return x + F.linear(hidden, state["mlp.2.weight"], state["mlp.2.bias"])


def model(state, num_heads, num_layers, tokens):
    """``(B, T)`` tokens to ``(B, T, V)`` logits: embeddings plus positions,
    the blocks, ``ln_f`` and ``head``."""
    positions = torch.arange(tokens.shape[1])
    x = F.embedding(tokens, state["tok_emb.weight"]) + F.embedding(positions, state["pos_emb.weight"])
    for layer in range(num_layers):
        x = block(state, num_heads, x, f"blocks.{layer}.")
    x = F.layer_norm(x, (x.shape[-1],), state["ln_f.weight"], state["ln_f.bias"])
    return F.linear(x, state["head.weight"], state["head.bias"])


def model_keys_values(state, num_heads, num_layers, tokens):
    """A list of ``(k, v)``, ``(B, H, T, d)`` each, one a block: what every
    block's KV cache holds after the tokens ``(B, T)``."""
    positions = torch.arange(tokens.shape[1])
    x = F.embedding(tokens, state["tok_emb.weight"]) + F.embedding(positions, state["pos_emb.weight"])
    found = []
    for layer in range(num_layers):
        found.append(block_keys_values(state, num_heads, x, f"blocks.{layer}."))
        x = block(state, num_heads, x, f"blocks.{layer}.")
    return found


def greedy(state, num_heads, num_layers, prompt, num_tokens):
    """``(tokens (B, T0 + N), logits (B, N, V))``: greedy generation with no
    cache, the whole sequence run through ``model`` again at every step; each
    step's logits are the last position's."""
    tokens, chosen = prompt, []
    for _ in range(num_tokens):
        last = model(state, num_heads, num_layers, tokens)[:, -1]  # (B, V)
        chosen.append(last)
        tokens = torch.cat([tokens, last.argmax(dim=-1, keepdim=True)], dim=1)
    return tokens, torch.stack(chosen, dim=1)


def text_windows(tokens, context):
    """``(inputs, targets)``, ``(windows, context)`` each: the tokens ``(N,)``
    cut into windows of ``context``, and each window's next tokens (the
    inputs shifted by one)."""
    windows = (len(tokens) - 1) // context
    inputs = tokens[:windows * context].view(windows, context)
    return inputs, tokens[1:windows * context + 1].view(windows, context)


def sampling_distribution(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
                          crossing_kept: bool = True) -> torch.Tensor:
    """``(B, V)`` float64: the probability of each token that sampling from
    ``logits`` ``(B, V)`` draws, as Hugging Face's ``TemperatureLogitsWarper``,
    ``TopKLogitsWarper`` and ``TopPLogitsWarper`` filter them, in that order.
    Top-p ranks the tokens from the least likely up and removes those whose
    running sum stays at or below ``1 - top_p``, never the most likely one.

    ``crossing_kept=False`` also removes the token whose running sum (from the
    most likely down) reaches ``top_p``: a misreading the checks name when a
    draw follows it."""
    scores = logits.double() / temperature
    if top_k is not None:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None:
        scores = _top_p(scores, top_p, crossing_kept)
    return torch.softmax(scores, dim=-1)


def _top_p(scores, top_p, crossing_kept):
    ascending, order = torch.sort(scores, dim=-1)
    running = torch.softmax(ascending, dim=-1).cumsum(dim=-1)
    removed = running <= 1 - top_p if crossing_kept else running <= 1 - top_p + torch.softmax(ascending, dim=-1)
    removed[..., -1] = False  # the most likely token stays
    return scores.masked_fill(removed.scatter(-1, order, removed), float("-inf"))
