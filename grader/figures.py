"""Small SVG drawings for the lessons: attention weights as heatmaps.

SVG written by hand rather than by a plotting library: the files are text,
so a reviewer sees what changed, the build writes exactly the same bytes on
every machine, and drawing a labelled grid needs no extra dependency.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

CELL = 46  # side of one heatmap cell, in pixels
LABEL = 64  # room for the row labels on the left and column labels on top
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"


def _blue(weight: float) -> str:
    """White for 0, deep blue for 1: the colour of one attention weight."""
    weight = min(max(weight, 0.0), 1.0)
    low, high = (247, 251, 255), (8, 48, 107)
    red, green, blue = (round(a + (b - a) * weight) for a, b in zip(low, high))
    return f"#{red:02x}{green:02x}{blue:02x}"


def heatmap_svg(
    weights: Sequence[Sequence[float]],
    row_labels: Sequence[str],
    column_labels: Sequence[str],
    title: str,
    masked: Sequence[Sequence[bool]] | None = None,
) -> str:
    """An attention-weight matrix drawn as a grid, one row per query.

    Args:
        weights: ``L`` rows of ``S`` numbers in [0, 1].
        row_labels: ``L`` query labels, drawn on the left.
        column_labels: ``S`` key labels, drawn on top.
        title: one line drawn above the grid.
        masked: optional ``L x S`` flags; a masked cell is drawn grey and
            crossed instead of coloured.

    Returns:
        The SVG document as text.
    """
    rows, columns = len(weights), len(weights[0])
    top = LABEL + 28
    width = max(LABEL + columns * CELL + 12, 440)  # the title needs room too
    height = top + rows * CELL + 30
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' {FONT} font-size='12'>",
        f"<rect width='{width}' height='{height}' fill='white'/>",
        f"<text x='{width / 2}' y='18' text-anchor='middle' font-size='14' "
        f"font-weight='bold'>{escape(title)}</text>",
        f"<text x='{LABEL + columns * CELL / 2}' y='40' text-anchor='middle' "
        f"fill='#555'>keys (attended to)</text>",
        f"<text x='14' y='{top + rows * CELL / 2}' text-anchor='middle' fill='#555' "
        f"transform='rotate(-90 14 {top + rows * CELL / 2})'>queries</text>",
    ]
    for j, label in enumerate(column_labels):
        x = LABEL + j * CELL + CELL / 2
        parts.append(f"<text x='{x}' y='{top - 8}' text-anchor='middle'>{escape(label)}</text>")
    for i, label in enumerate(row_labels):
        y = top + i * CELL + CELL / 2 + 4
        parts.append(f"<text x='{LABEL - 8}' y='{y}' text-anchor='end'>{escape(label)}</text>")
        for j in range(columns):
            x, y0 = LABEL + j * CELL, top + i * CELL
            if masked is not None and masked[i][j]:
                parts.append(
                    f"<rect x='{x}' y='{y0}' width='{CELL}' height='{CELL}' "
                    "fill='#d9d9d9' stroke='white'/>"
                    f"<path d='M{x + 14} {y0 + 14}L{x + CELL - 14} {y0 + CELL - 14}"
                    f"M{x + CELL - 14} {y0 + 14}L{x + 14} {y0 + CELL - 14}' stroke='#999'/>"
                )
                continue
            weight = float(weights[i][j])
            ink = "white" if weight > 0.5 else "black"
            parts.append(
                f"<rect x='{x}' y='{y0}' width='{CELL}' height='{CELL}' "
                f"fill='{_blue(weight)}' stroke='white'/>"
                f"<text x='{x + CELL / 2}' y='{y0 + CELL / 2 + 4}' text-anchor='middle' "
                f"fill='{ink}'>{weight:.2f}</text>"
            )
    parts.append(
        f"<text x='{LABEL}' y='{height - 10}' fill='#555'>"
        "each row sums to 1 over the keys</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
