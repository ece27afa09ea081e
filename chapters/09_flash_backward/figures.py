"""Draws the figures of chapter 9: ``figures()`` returns each SVG by its name in ``figures/``.

Everything is computed here from the chapter's formulas, with plain Python
numbers (no randomness, and no import of the reference solution, which
students do not receive):

* ``backward_blocks.svg``: the backward pass at one block of keys. On the
  left the ``L x S`` grid of weights with the current block of keys solid
  (the causal mask's cells greyed, bottom-right, ``L < S``); beside it what
  that block needs from every query (``Q``, ``dO``, ``lse``, ``D``) and
  what it writes: its own rows of ``dK`` and ``dV``, whole, and an addition
  to every row of ``dQ``.
* ``saved.svg``: what each way of training attention keeps between the
  forward and the backward pass, in numbers, at ``L = S = 4096``,
  ``d = 64``: the ``(L, S)`` weights of plain attention against ``q``, ``k``,
  ``v``, ``out`` and ``lse``.
"""

from grader.figures import MUTED, TEXT, svg_document, text

BLOCK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")
MASKED = "#d9d9d9"
CELL = 26
QUERIES, KEYS, BLOCK = 6, 10, 3  # blocks of 3, 3, 3 and 1 key
CURRENT = 1  # the block of keys the picture is at


def _rect(x: float, y: float, width: float, height: float, fill: str, opacity: float = 1.0,
          stroke: str = "white", stroke_width: float = 1.0) -> str:
    return (f"<rect x='{x:.1f}' y='{y:.1f}' width='{width:.1f}' height='{height:.1f}' fill='{fill}' "
            f"fill-opacity='{opacity}' stroke='{stroke}' stroke-width='{stroke_width}'/>")


def _blocks() -> list[tuple[int, int]]:
    """``(start, end)`` of each block of keys, as ``range(0, S, block)`` gives them."""
    return [(start, min(start + BLOCK, KEYS)) for start in range(0, KEYS, BLOCK)]


def _column(left: float, top: float, rows: int, width: int, colour: str, label: str, opacity: float = 0.6,
            note: str = "") -> list[str]:
    """A tensor drawn as ``rows`` cells of ``width`` columns, labelled above (and noted below)."""
    parts = [_rect(left + j * CELL / 2, top + i * CELL, CELL / 2, CELL, colour, opacity)
             for i in range(rows) for j in range(width)]
    parts.append(text(left + width * CELL / 4, top - 8, label, size=11, bold=True))
    if note:
        parts.append(text(left + width * CELL / 4, top + rows * CELL + 16, note, size=10, colour=MUTED))
    return parts


def _backward_blocks() -> str:
    left, top = 70, 70
    parts = [text(330, 22, "Backward at one block of keys: P rebuilt from lse, never stored", size=14, bold=True)]
    for index, (start, end) in enumerate(_blocks()):
        colour = BLOCK_COLOURS[index]
        for i in range(QUERIES):
            for j in range(start, end):
                x, y = left + j * CELL, top + i * CELL
                if j > i + KEYS - QUERIES:  # bottom-right: query i sees keys 0 .. i + S - L
                    parts.append(_rect(x, y, CELL, CELL, MASKED))
                else:
                    parts.append(_rect(x, y, CELL, CELL, colour, 0.85 if index == CURRENT else 0.15))
        parts.append(text(left + (start + end) / 2 * CELL, top - 8, f"keys {start}..{end - 1}", size=10,
                          colour=colour))
    start, end = _blocks()[CURRENT]
    parts.append(_rect(left + start * CELL, top, (end - start) * CELL, QUERIES * CELL, "none", stroke=TEXT,
                       stroke_width=2.5))
    for i in range(QUERIES):
        parts.append(text(left - 6, top + i * CELL + CELL / 2 + 4, f"q {i}", anchor="end", size=10))
    below = top + QUERIES * CELL + 24
    parts.append(text(left + KEYS * CELL / 2, below, "P, dP, dS of this block: (L, block), then freed", size=11))
    parts.append(text(left + KEYS * CELL / 2, below + 16,
                      "P = exp(s - lse),  dS = P * (dP - D),  dP = dO V^T", size=11, colour=MUTED))
    # What the block reads from every query, and what it writes.
    reads = left + KEYS * CELL + 40
    parts += _column(reads, top, QUERIES, 2, "#7f7f7f", "Q, dO")
    parts += _column(reads + 44, top, QUERIES, 1, "#bcbd22", "lse")
    parts += _column(reads + 74, top, QUERIES, 1, "#17becf", "D")
    parts.append(text(reads + 52, below, "read for every query", size=10, colour=MUTED))
    writes = reads + 130
    colour = BLOCK_COLOURS[CURRENT]
    parts += _column(writes, top, QUERIES, 2, colour, "dQ +=", 0.35)
    parts += _column(writes + 50, top + start * CELL / 2, end - start, 2, colour, "dK, dV", 0.85)
    parts.append(text(writes + 45, below, "dQ: every block adds", size=10, colour=MUTED))
    parts.append(text(writes + 45, below + 14, "dK, dV: this block's rows, whole", size=10, colour=MUTED))
    return svg_document(660, below + 40, parts)


# -- saved.svg ------------------------------------------------------------------------------

LENGTH, WIDTH = 4096, 64  # L = S, d = d_v


def _saved() -> str:
    """Bars of the numbers kept for backward, on one scale."""
    inputs = 3 * LENGTH * WIDTH  # q, k, v
    rows = [
        ("plain attention: q, k, v, the (L, S) weights", inputs + LENGTH * LENGTH, "#d62728"),
        ("FlashAttentionFunction: q, k, v, out, lse", inputs + LENGTH * WIDTH + LENGTH, "#2ca02c"),
    ]
    largest = max(count for _, count, _ in rows)
    left, top, span = 20, 60, 520
    parts = [text(300, 22, f"Numbers kept for backward, L = S = {LENGTH:,}, d = {WIDTH}", size=14, bold=True)]
    for index, (label, count, colour) in enumerate(rows):
        y = top + index * 56
        parts.append(text(left, y, label, anchor="start", size=11))
        parts.append(_rect(left, y + 8, span * count / largest, 22, colour, 0.8))
        parts.append(text(left + span * count / largest + 6, y + 24, f"{count:,} ({count * 4 / 2**20:.0f} MiB in float32)",
                          anchor="start", size=10, colour=MUTED))
    return svg_document(760, top + 2 * 56 + 10, parts)


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/09_flash_backward/figures/``."""
    return {"backward_blocks.svg": _backward_blocks(), "saved.svg": _saved()}
