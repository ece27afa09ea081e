"""Chapter 8's oracles: a pre-norm transformer block and the tiny language
model written with PyTorch's functions (``F.layer_norm``, ``F.linear``,
``F.scaled_dot_product_attention`` with ``is_causal=True``, ``F.gelu``,
``F.embedding``) on the weights of a state dict, and the text cut into
windows with their next tokens.

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

__all__ = ["block", "model", "text_windows"]


def block(state, num_heads, x, prefix=""):
    """``x + attn(ln1(x))``, then ``+ mlp(ln2(.))``: ``(B, T, D)`` to ``(B, T, D)``,
    with the weights named ``prefix + name`` in ``state``."""
    def w(name):
        return state[prefix + name]

    batch, length, d_model = x.shape
    normed = F.layer_norm(x, (d_model,), w("ln1.weight"), w("ln1.bias"))
    q, k, v = F.linear(normed, w("qkv.weight"), w("qkv.bias")).split(d_model, dim=-1)  # 3 x (B, T, D)
    q, k, v = (t.reshape(batch, length, num_heads, -1).transpose(1, 2) for t in (q, k, v))  # (B, H, T, d)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, d)
    x = x + F.linear(heads.transpose(1, 2).reshape(batch, length, d_model), w("proj.weight"), w("proj.bias"))
    hidden = F.gelu(F.linear(F.layer_norm(x, (d_model,), w("ln2.weight"), w("ln2.bias")),
                             w("mlp.0.weight"), w("mlp.0.bias")))  # (B, T, 4 D)
    return x + F.linear(hidden, w("mlp.2.weight"), w("mlp.2.bias"))


def model(state, num_heads, num_layers, tokens):
    """``(B, T)`` tokens to ``(B, T, V)`` logits: embeddings plus positions,
    the blocks, ``ln_f`` and ``head``."""
    positions = torch.arange(tokens.shape[1])
    x = F.embedding(tokens, state["tok_emb.weight"]) + F.embedding(positions, state["pos_emb.weight"])
    for layer in range(num_layers):
        x = block(state, num_heads, x, f"blocks.{layer}.")
    x = F.layer_norm(x, (x.shape[-1],), state["ln_f.weight"], state["ln_f.bias"])
    return F.linear(x, state["head.weight"], state["head.bias"])


def text_windows(tokens, context):
    """``(inputs, targets)``, ``(windows, context)`` each: the tokens ``(N,)``
    cut into windows of ``context``, and each window's next tokens (the
    inputs shifted by one)."""
    windows = (len(tokens) - 1) // context
    inputs = tokens[:windows * context].view(windows, context)
    return inputs, tokens[1:windows * context + 1].view(windows, context)
