"""Draws the figures of chapter 12: ``figures()`` returns each SVG by its name in ``figures/``.

TODO: what the figures show, and from which fixed numbers (no randomness:
the same figures on every machine).
"""

from grader.figures import TOKENS, heatmap_svg


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/12_latent_attention/figures/``."""
    causal = [[column <= row for column in range(len(TOKENS))] for row in range(len(TOKENS))]  # (T, T)
    weights = [[1.0 / (row + 1) if seen else 0.0 for seen in sees] for row, sees in enumerate(causal)]
    return {
        "latent_attention.svg": heatmap_svg(weights, TOKENS, TOKENS, "TODO: the figure's title",
                                          masked=[[not seen for seen in sees] for sees in causal]),
    }
