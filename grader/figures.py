"""Small SVG drawings for the lessons: attention weights as heatmaps, and the
pieces every chapter's ``figures.py`` draws its diagrams with.

SVG written by hand rather than by a plotting library: the files are text,
so a reviewer sees what changed, the build writes exactly the same bytes on
every machine, and drawing a labelled grid needs no extra dependency.

Every helper returns SVG text; a figure is a list of such parts handed to
``svg_document``. The number formats are part of each helper's contract:
the committed figures are compared byte for byte with what the build
writes, so changing a format here rewrites the figures of several chapters.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

CELL = 46  # side of one heatmap cell, in pixels
LABEL = 64  # room for the row labels on the left and column labels on top
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"
TEXT = "#222"  # the ink of words and outlines in the diagrams
MUTED = "#666"  # the ink of notes, axis names and other secondary words

# -- the course's running example ----------------------------------------------------

# The sentence of chapter 1's figures, which chapter 4's figures reuse so that
# the weights there are the ones the student has already seen.
TOKENS = ["the", "cat", "sat", "on", "the", "mat"]
# Hand-made embeddings of width 4, one row a token. Features: [article,
# noun, verb/preposition, "animal-ness"]. Both "the" tokens share one
# embedding, so without positions they attend identically. Plain lists, so
# that drawing needs no torch: a figure script turns them into a tensor.
EMBEDDINGS = [
    [2.0, 0.0, 0.0, 0.0],  # the
    [0.0, 2.0, 0.0, 1.5],  # cat
    [0.0, 0.5, 2.0, 1.0],  # sat
    [0.5, 0.0, 1.5, 0.0],  # on
    [2.0, 0.0, 0.0, 0.0],  # the
    [0.0, 2.0, 0.0, 0.0],  # mat
]

# -- the pieces of a drawing ---------------------------------------------------------


def svg_document(width: int, height: int, body: Sequence[str]) -> str:
    """A whole SVG file: a white page of ``width x height`` pixels holding ``body``.

    Args:
        width, height: the page's size in whole pixels (written as given).
        body: the drawing's parts, one line of the file each, in drawing order.

    Returns:
        The document as text, one part a line, ending with a newline.
    """
    head = (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' {FONT} font-size='12'>")
    page = f"<rect width='{width}' height='{height}' fill='white'/>"
    return "\n".join([head, page, *body, "</svg>"]) + "\n"


def text(x: float, y: float, words: str, anchor: str = "middle", size: int = 12,
         colour: str = TEXT, bold: bool = False) -> str:
    """One line of words whose baseline passes through ``(x, y)``.

    Args:
        x, y: where the line is anchored, in pixels (written to 0.1 pixel).
        words: the text; ``<``, ``>`` and ``&`` are escaped.
        anchor: ``"start"``, ``"middle"`` or ``"end"``: which part of the
            line sits at ``x``.
        size: the font size in pixels.
        colour: the ink.
        bold: whether the words are bold.
    """
    weight = " font-weight='bold'" if bold else ""
    return (f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' font-size='{size}' "
            f"fill='{colour}'{weight}>{escape(words)}</text>")


def vertical_text(x: float, y: float, words: str, colour: str = MUTED) -> str:
    """The name of a vertical axis: words centred on ``(x, y)``, turned a
    quarter turn anticlockwise so that they read from bottom to top.

    Args:
        x, y: the centre of the words, in pixels (written as given).
        words: the text; ``<``, ``>`` and ``&`` are escaped.
        colour: the ink.
    """
    return (f"<text x='{x}' y='{y}' text-anchor='middle' fill='{colour}' "
            f"transform='rotate(-90 {x} {y})'>{escape(words)}</text>")


def line(x0: float, y0: float, x1: float, y1: float, colour: str = TEXT, width: float = 1.2,
         dashed: bool = False) -> str:
    """A straight stroke from ``(x0, y0)`` to ``(x1, y1)``.

    Args:
        x0, y0, x1, y1: the two ends, in pixels (written to 0.1 pixel).
        colour: the stroke's colour.
        width: the stroke's width in pixels, written as given (``2`` and
            ``2.0`` are different bytes); the default is a thin connector.
        dashed: dashes of 5 pixels and gaps of 3 instead of a solid stroke.
    """
    dash = " stroke-dasharray='5 3'" if dashed else ""
    return (f"<line x1='{x0:.1f}' y1='{y0:.1f}' x2='{x1:.1f}' y2='{y1:.1f}' stroke='{colour}' "
            f"stroke-width='{width}'{dash}/>")


def blue(weight: float) -> str:
    """White for 0, deep blue for 1: the colour of one attention weight.

    Args:
        weight: a number in [0, 1]; anything outside is clamped to it.

    Returns:
        The colour as ``#rrggbb``.
    """
    weight = min(max(weight, 0.0), 1.0)
    low, high = (247, 251, 255), (8, 48, 107)  # red, green, blue at 0 and at 1
    return "#" + "".join(f"{round(a + (b - a) * weight):02x}" for a, b in zip(low, high))


def masked_cell(x: float, y: float) -> str:
    """A hidden (masked) query-key pair: a grey ``CELL x CELL`` square with
    its top-left corner at ``(x, y)``, crossed out.

    Args:
        x, y: the square's top-left corner, in pixels (written as ``:g``, so
            whole numbers print without a decimal point).
    """
    near, far = 14, CELL - 14  # the cross stops short of the square's edges
    return (f"<rect x='{x:g}' y='{y:g}' width='{CELL}' height='{CELL}' fill='#d9d9d9' stroke='white'/>"
            f"<path d='M{x + near:g} {y + near:g}L{x + far:g} {y + far:g}"
            f"M{x + far:g} {y + near:g}L{x + near:g} {y + far:g}' stroke='#999'/>")


# -- heatmaps ------------------------------------------------------------------------


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
        f"<text x='{width / 2}' y='18' text-anchor='middle' font-size='14' "
        f"font-weight='bold'>{escape(title)}</text>",
        f"<text x='{LABEL + columns * CELL / 2}' y='40' text-anchor='middle' "
        f"fill='#555'>keys (attended to)</text>",
        vertical_text(14, top + rows * CELL / 2, "queries", "#555"),
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
                parts.append(masked_cell(x, y0))
                continue
            weight = float(weights[i][j])
            ink = "white" if weight > 0.5 else "black"
            parts.append(
                f"<rect x='{x}' y='{y0}' width='{CELL}' height='{CELL}' "
                f"fill='{blue(weight)}' stroke='white'/>"
                f"<text x='{x + CELL / 2}' y='{y0 + CELL / 2 + 4}' text-anchor='middle' "
                f"fill='{ink}'>{weight:.2f}</text>"
            )
    parts.append(
        f"<text x='{LABEL}' y='{height - 10}' fill='#555'>"
        "each row sums to 1 over the keys</text>"
    )
    return svg_document(width, height, parts)
