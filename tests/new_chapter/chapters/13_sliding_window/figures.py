"""Draws the figures of chapter 13: ``figures()`` returns each SVG by its name in ``figures/``.

The six tokens of ``grader.figures.TOKENS`` and a window of 3: each query's
weight spread evenly over the keys its window holds (no randomness, so the
figure is the same on every machine).
"""

from grader.figures import TOKENS, heatmap_svg

WINDOW = 3


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/13_sliding_window/figures/``."""
    sees = [[0 <= query - key < WINDOW for key in range(len(TOKENS))] for query in range(len(TOKENS))]  # (T, T)
    weights = [[1.0 / sum(row) if seen else 0.0 for seen in row] for row in sees]
    return {
        "sliding_window.svg": heatmap_svg(weights, TOKENS, TOKENS, f"a window of {WINDOW}: itself and two before",
                                          masked=[[not seen for seen in row] for row in sees]),
    }
