"""Draws the figures of chapter 7: ``figures()`` returns each SVG by its name in ``figures/``.

Everything is computed here from the chapter's formulas (no randomness, and
no import of the reference solution, which students do not receive):

* ``tiling.svg``: the ``L x S`` score matrix cut into blocks of keys; one
  ``L x block`` piece is in memory at a time, next to the running max ``m``,
  sum ``l`` and output ``acc`` of every query; with the causal mask's
  blocked cells greyed (bottom-right, ``L < S``);
* ``memory.svg``: the bytes of the largest tensor in float32 at T = 4096 for
  the whole score matrix and for pieces of 512, 128 and 32 keys;
* ``loops.svg``: the order in which FlashAttention, FlashAttention-2 and the
  course's ``tiled_attention`` visit the blocks of the score matrix.
"""

from grader.figures import MUTED, TEXT, svg_document, text

BLOCK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")
MASKED = "#d9d9d9"
CELL = 26


def _rect(x: float, y: float, width: float, height: float, fill: str, opacity: float = 1.0,
          stroke: str = "white", stroke_width: float = 1.0) -> str:
    return (f"<rect x='{x:.1f}' y='{y:.1f}' width='{width:.1f}' height='{height:.1f}' fill='{fill}' "
            f"fill-opacity='{opacity}' stroke='{stroke}' stroke-width='{stroke_width}'/>")


# -- tiling.svg ------------------------------------------------------------------------------

QUERIES, KEYS, BLOCK = 6, 10, 3  # blocks of 3, 3, 3 and 1 key: the last one is shorter
CURRENT = 1  # the block being processed in the picture


def _blocks() -> list[tuple[int, int]]:
    """``(start, end)`` of each block of keys, as ``range(0, S, block)`` gives them."""
    return [(start, min(start + BLOCK, KEYS)) for start in range(0, KEYS, BLOCK)]


def _score_grid(left: float, top: float, causal: bool) -> list[str]:
    """The L x S scores, one colour a block; the current block solid, the others faint."""
    parts = []
    for index, (start, end) in enumerate(_blocks()):
        colour = BLOCK_COLOURS[index]
        for i in range(QUERIES):
            for j in range(start, end):
                x, y = left + j * CELL, top + i * CELL
                if causal and j > i + KEYS - QUERIES:  # bottom-right: query i sees keys 0 .. i + S - L
                    parts.append(_rect(x, y, CELL, CELL, MASKED))
                else:
                    parts.append(_rect(x, y, CELL, CELL, colour, 0.85 if index == CURRENT else 0.18))
        parts.append(text(left + (start + end) / 2 * CELL, top - 8, f"keys {start}..{end - 1}",
                          size=10, colour=colour))
    start, end = _blocks()[CURRENT]
    parts.append(_rect(left + start * CELL, top, (end - start) * CELL, QUERIES * CELL, "none",
                       stroke=TEXT, stroke_width=2.5))
    for i in range(QUERIES):
        parts.append(text(left - 6, top + i * CELL + CELL / 2 + 4, f"q {i}", anchor="end", size=10))
    return parts


def _running_columns(left: float, top: float) -> list[str]:
    """The state each query keeps between blocks: m, l (one number each) and acc (d_v numbers)."""
    parts = []
    for offset, (label, width) in zip((0, 36, 72), (("m", 1), ("l", 1), ("acc", 3))):
        x = left + offset if label != "acc" else left + offset
        for i in range(QUERIES):
            parts.append(_rect(x, top + i * CELL, width * CELL * 0.9 if label == "acc" else CELL * 0.9,
                               CELL, "#8c564b", 0.35))
        parts.append(text(x + (width * CELL * 0.45 if label == "acc" else CELL * 0.45), top - 8, label,
                          size=11, bold=True))
    return parts


def tiling_svg() -> str:
    width, height = 760, 590
    left, grid_top = 70, 86
    body = [text(width / 2, 22, "Tiled attention: the L x S scores, one block of keys at a time",
                 size=14, bold=True),
            text(width / 2, 42, f"L = {QUERIES} queries, S = {KEYS} keys, block_size = {BLOCK}: "
                 "blocks of 3, 3, 3 and 1 key", size=11, colour=MUTED)]
    body += _score_grid(left, grid_top, causal=False)
    state_left = left + KEYS * CELL + 60
    body += _running_columns(state_left, grid_top)
    body.append(text(state_left, grid_top + QUERIES * CELL + 22,
                     "kept for every query between blocks", anchor="start", size=11, colour=MUTED))
    body.append(text(left, grid_top + QUERIES * CELL + 22, "in memory: the outlined (L, block) scores",
                     anchor="start", size=11, colour=MUTED))
    body.append(text(left, grid_top + QUERIES * CELL + 40, "the faint ones are never stored together",
                     anchor="start", size=11, colour=MUTED))
    causal_top = grid_top + QUERIES * CELL + 104
    body.append(text(left, causal_top - 30, f"causal, bottom-right (chapter 4): query i sees keys "
                     f"0 .. i + {KEYS - QUERIES}; grey = masked inside each block", anchor="start",
                     size=12, bold=True))
    body += _score_grid(left, causal_top, causal=True)
    body.append(text(left, causal_top + QUERIES * CELL + 22, "the mask of a block compares the keys' "
                     "own positions start .. end - 1 with each query's position", anchor="start",
                     size=11, colour=MUTED))
    body.append(text(20, height - 34, "for each block: s = q k_block^T / sqrt(d);  m_new = max(m, "
                     "rowmax s);  p = exp(s - m_new)", anchor="start", size=11, colour=MUTED))
    body.append(text(20, height - 14, "l = l exp(m - m_new) + rowsum p;  acc = acc exp(m - m_new) + "
                     "p v_block;  m = m_new;  at the end, output = acc / l", anchor="start", size=11,
                     colour=MUTED))
    return svg_document(width, height, body)


# -- memory.svg ------------------------------------------------------------------------------

T = 4096
FLOAT32 = 4
MIB = 2**20


def memory_svg() -> str:
    rows = [("whole (T, T) scores", T)] + [(f"blocks of {block} keys", block) for block in (512, 128, 32)]
    width, height = 720, 280
    left, top, bar_h, gap = 190, 70, 30, 14
    plot_w = width - left - 120
    largest = T * T * FLOAT32 / MIB

    body = [text(width / 2, 22, f"Largest score tensor of one head at T = {T}, float32", size=14, bold=True),
            text(width / 2, 42, "T x T numbers for the whole matrix, T x block for one piece",
                 size=11, colour=MUTED)]
    for index, (label, block) in enumerate(rows):
        y = top + index * (bar_h + gap)
        mib = T * block * FLOAT32 / MIB
        colour = "#c0392b" if block == T else BLOCK_COLOURS[index]
        body.append(text(left - 10, y + bar_h / 2 + 4, label, anchor="end"))
        body.append(_rect(left, y, max(plot_w * mib / largest, 2), bar_h, colour, 0.85))
        body.append(text(left + max(plot_w * mib / largest, 2) + 8, y + bar_h / 2 + 4, f"{mib:g} MiB",
                         anchor="start", bold=True))
    body.append(text(20, height - 12, "the output and the running m, l, acc are T x d_v and T: "
                     "the same for every block size", anchor="start", colour=MUTED))
    return svg_document(width, height, body)


# -- loops.svg -------------------------------------------------------------------------------

QUERY_BLOCKS, KEY_BLOCKS, BLOCK_CELL = 3, 4, 38


def _visits(left: float, top: float, rows: int, order: list[tuple[int, int]], colour: str) -> list[str]:
    """A grid of ``rows`` x KEY_BLOCKS blocks of scores, each numbered by when it is visited;
    the rows share the height of QUERY_BLOCKS blocks (one row: all the queries at once)."""
    parts = []
    row_height = QUERY_BLOCKS * BLOCK_CELL / rows
    for step, (row, column) in enumerate(order, start=1):
        x, y = left + column * BLOCK_CELL, top + row * row_height
        parts.append(_rect(x, y, BLOCK_CELL, row_height, colour, 0.15 + 0.7 * step / len(order)))
        parts.append(text(x + BLOCK_CELL / 2, y + row_height / 2 + 5, str(step), size=13, bold=True))
    for column in range(KEY_BLOCKS):
        parts.append(text(left + (column + 0.5) * BLOCK_CELL, top - 6, f"K{column + 1}", size=10,
                          colour=MUTED))
    labels = [f"Q{row + 1}" for row in range(rows)] if rows > 1 else ["all Q"]
    for row, label in enumerate(labels):
        parts.append(text(left - 6, top + (row + 0.5) * row_height + 4, label, anchor="end", size=10,
                          colour=MUTED))
    return parts


def loops_svg() -> str:
    width, height = 780, 330
    top = 96
    panels = [
        ("FlashAttention", "outer loop: K/V blocks; inner: Q blocks",
         [(row, column) for column in range(KEY_BLOCKS) for row in range(QUERY_BLOCKS)], QUERY_BLOCKS,
         ["O_i, l_i, m_i read from and written", "to main memory at every step,", "O_i divided by l_i every time"]),
        ("FlashAttention-2", "outer loop: Q blocks; inner: K/V blocks",
         [(row, column) for row in range(QUERY_BLOCKS) for column in range(KEY_BLOCKS)], QUERY_BLOCKS,
         ["O_i unnormalised on chip,", "divided by l_i once at the end;", "L_i = m_i + log l_i written out"]),
        ("this course's tiled_attention", "one loop: K/V blocks, all queries",
         [(0, column) for column in range(KEY_BLOCKS)], 1,
         ["acc unnormalised, acc / l once", "at the end; lse = m + log l", "(FlashAttention-2, one Q block)"]),
    ]
    body = [text(width / 2, 22, "Which block of the scores is computed when", size=14, bold=True),
            text(width / 2, 42, "rows: blocks of queries; columns: blocks of keys and values; "
                 "numbers: the order of the steps", size=11, colour=MUTED)]
    for index, (title, loops, order, rows, notes) in enumerate(panels):
        left = 60 + index * 250
        body.append(text(left + KEY_BLOCKS * BLOCK_CELL / 2, 70, title, size=12, bold=True))
        body.append(text(left + KEY_BLOCKS * BLOCK_CELL / 2, 84, loops, size=10, colour=MUTED))
        body += _visits(left, top + 14, rows, order, BLOCK_COLOURS[index])
        for line_index, note in enumerate(notes):
            body.append(text(left - 40, top + 14 + QUERY_BLOCKS * BLOCK_CELL + 30 + 16 * line_index, note,
                             anchor="start", size=10, colour=MUTED))
    return svg_document(width, height, body)


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/07_memory_efficient_attention/figures/``."""
    return {"tiling.svg": tiling_svg(), "memory.svg": memory_svg(), "loops.svg": loops_svg()}
