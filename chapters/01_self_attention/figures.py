"""Draws the figures of chapter 1: ``figures()`` returns each SVG by its name in ``figures/``.

Six tokens with hand-made 4-dimensional embeddings (``TOKENS`` and
``EMBEDDINGS`` of ``grader.figures``, shared with chapter 4; no randomness,
so the figures are the same on every machine), attended with identity
projections:
``weights = softmax(x x^T / sqrt(4))``, once without a mask and once with a
causal mask.
"""

import torch

from grader.figures import EMBEDDINGS, TOKENS, heatmap_svg


def _weights(mask: torch.Tensor | None) -> torch.Tensor:
    x = torch.tensor(EMBEDDINGS)  # (T, d) = (6, 4)
    scores = x @ x.T / x.shape[-1] ** 0.5  # (T, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)  # (T, T)


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/01_self_attention/figures/``."""
    causal = torch.ones(len(TOKENS), len(TOKENS), dtype=torch.bool).tril()
    return {
        "attention_weights.svg": heatmap_svg(
            _weights(None).tolist(),
            TOKENS,
            TOKENS,
            "softmax(x xᵀ / √d): every token sees every token",
        ),
        "causal_attention_weights.svg": heatmap_svg(
            _weights(causal).tolist(),
            TOKENS,
            TOKENS,
            "with a causal mask: True on and below the diagonal",
            masked=(~causal).tolist(),
        ),
    }
