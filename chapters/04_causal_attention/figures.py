"""Draws the figures of chapter 4: ``figures()`` returns each SVG by its name in ``figures/``.

* ``causal_mask.svg``: the causal mask of six tokens, which keys each query sees.
* ``alignment.svg``: three new queries over six keys, aligned bottom-right
  (``causal_mask(3, 6)``, right for a cache) and top-left (``is_causal=True``).
* ``kv_cache_step.svg``: one decoding step: five cached keys and values, the
  new token's key and value appended, the new query's row of weights.

Everything is computed from fixed numbers (no randomness), so the build
writes the same bytes on every machine.
"""

from xml.sax.saxutils import escape

import torch

# TOKENS and EMBEDDINGS are the sentence of chapter 1's figures, so that the
# weights here are the ones the student has already seen (identity
# projections, d = 4).
from grader.figures import CELL, EMBEDDINGS, LABEL, TOKENS, blue, masked_cell, svg_document

ALLOWED = "#6baed6"  # a key the query may attend to
NEW = "#fd8d3c"  # the new token's query, key and value
CACHED = "#d9d9d9"  # keys and values read from the cache
INK = "#555"


def _causal(num_queries: int, num_keys: int, bottom_right: bool = True) -> torch.Tensor:
    """(L, S) bool, True = may attend; bottom-right (the course's) or top-left."""
    offset = num_keys - num_queries if bottom_right else 0
    return torch.ones(num_queries, num_keys, dtype=torch.bool).tril(offset)


def _text(x: float, y: float, text: str, anchor: str = "middle", **attributes: str) -> str:
    """One line of words at ``(x, y)`` with any further attributes
    (``font_size="13"`` writes ``font-size='13'``). Not ``grader.figures.text``:
    this chapter's figures were drawn with ``:g`` numbers and only the
    attributes asked for, and they must stay byte for byte as they are."""
    extra = "".join(f" {key.replace('_', '-')}='{value}'" for key, value in attributes.items())
    return f"<text x='{x:g}' y='{y:g}' text-anchor='{anchor}'{extra}>{escape(text)}</text>"


def _box(x: float, y: float, fill: str, width: float = CELL, height: float = CELL) -> str:
    return f"<rect x='{x:g}' y='{y:g}' width='{width:g}' height='{height:g}' fill='{fill}' stroke='white'/>"


def _mask_panel(mask: torch.Tensor, left: float, top: float, title: str, row_labels: list[str],
                column_labels: list[str], note: str = "") -> list[str]:
    """A mask drawn as a grid, one row per query: blue may attend, grey crossed blocked."""
    rows, columns = mask.shape
    parts = [_text(left + LABEL + columns * CELL / 2, top, title, font_size="13", font_weight="bold")]
    if note:
        parts.append(_text(left + LABEL + columns * CELL / 2, top + 18, note, fill=INK))
    grid_top = top + 46
    for j, label in enumerate(column_labels):
        parts.append(_text(left + LABEL + j * CELL + CELL / 2, grid_top - 8, label))
    for i, label in enumerate(row_labels):
        parts.append(_text(left + LABEL - 8, grid_top + i * CELL + CELL / 2 + 4, label, anchor="end"))
        for j in range(columns):
            x, y = left + LABEL + j * CELL, grid_top + i * CELL
            parts.append(_box(x, y, ALLOWED) if mask[i, j] else masked_cell(x, y))
    return parts


def _legend(x: float, y: float) -> list[str]:
    return [
        _box(x, y - 11, ALLOWED, 14, 14), _text(x + 20, y, "True: may attend", anchor="start"),
        _box(x + 150, y - 11, CACHED, 14, 14),
        _text(x + 170, y, "False: blocked (score set to -inf)", anchor="start"),
    ]


def causal_mask_svg() -> str:
    size = len(TOKENS)
    labels = [f"{t} {i}" for i, t in enumerate(TOKENS)]
    parts = _mask_panel(_causal(size, size), 0, 20, "causal_mask(6): query i sees keys 0..i",
                        labels, labels, "the diagonal is True: every token sees itself")
    height = 20 + 46 + size * CELL + 34
    parts += _legend(LABEL, height - 12)
    parts.append(_text(14, 66 + size * CELL / 2, "queries", fill=INK,
                       transform=f"rotate(-90 14 {66 + size * CELL / 2:g})"))
    return svg_document(max(LABEL + size * CELL + 16, 440), height, parts)


def alignment_svg() -> str:
    """Three new tokens (positions 3, 4, 5) after three cached ones."""
    queries, keys = 3, 6
    rows = [f"q{i} = token {i + keys - queries}" for i in range(queries)]
    columns = [f"k{j}" for j in range(keys)]
    panel = LABEL + 56 + keys * CELL  # each panel's width, row labels included
    parts = []
    for index, (bottom_right, title, note) in enumerate([
        (True, "bottom-right: causal_mask(3, 6)", "right for a KV cache: q0 is token 3"),
        (False, "top-left: is_causal=True", "wrong here: q0 sees k0 only, as if it were token 0"),
    ]):
        left = 56 + index * (panel + 30)
        parts += _mask_panel(_causal(queries, keys, bottom_right), left, 20, title, rows, columns, note)
        grid_left, grid_bottom = left + LABEL, 66 + queries * CELL
        for start, stop, label in ((0, 3, "cached (T_past = 3)"), (3, 6, "new (T_new = 3)")):
            x0, x1 = grid_left + start * CELL + 3, grid_left + stop * CELL - 3
            parts.append(f"<path d='M{x0:g} {grid_bottom + 6:g}V{grid_bottom + 12:g}H{x1:g}"
                         f"V{grid_bottom + 6:g}' fill='none' stroke='{INK}'/>")
            parts.append(_text((x0 + x1) / 2, grid_bottom + 27, label, fill=INK))
    height = 66 + queries * CELL + 68
    parts += _legend(56 + LABEL, height - 12)
    return svg_document(56 + 2 * panel + 30, height, parts)


def _step_weights() -> torch.Tensor:
    """The last token's weights over all six keys: one row of causal attention."""
    x = torch.tensor(EMBEDDINGS)  # (T, d) = (6, 4)
    scores = x[-1:] @ x.T / x.shape[-1] ** 0.5  # (1, T): the new query against every key
    return torch.softmax(scores, dim=-1)[0]  # (T,)


def kv_cache_step_svg() -> str:
    size = len(TOKENS)
    weights = _step_weights()
    left, top = 240, 70
    parts = [_text((left + size * CELL + 150) / 2, 22, "one decoding step with a KV cache",
                   font_size="14", font_weight="bold"),
             _text((left + size * CELL + 150) / 2, 42,
                   "the new token 'mat' (position 5) arrives; tokens 0..4 are cached", fill=INK)]
    for j, token in enumerate(TOKENS):
        parts.append(_text(left + j * CELL + CELL / 2, top - 8, token))
    rows = [("keys k_j", "k"), ("weights of q5", None), ("values v_j", "v")]
    for i, (label, letter) in enumerate(rows):
        y = top + i * (CELL + 12)
        parts.append(_text(left - 10, y + CELL / 2 + 4, label, anchor="end"))
        for j in range(size):
            x = left + j * CELL
            if letter is None:  # the weights: blue with the number, as in chapter 1
                weight = float(weights[j])
                parts.append(_box(x, y, blue(weight)))
                parts.append(_text(x + CELL / 2, y + CELL / 2 + 4, f"{weight:.2f}",
                                   fill="white" if weight > 0.5 else "black"))
            else:
                parts.append(_box(x, y, NEW if j == size - 1 else CACHED))
                parts.append(_text(x + CELL / 2, y + CELL / 2 + 4, f"{letter}{j}"))
    # The new query, on the weights' row, pointing at it.
    query_y = top + CELL + 12
    parts.append(_box(18, query_y, NEW))
    parts.append(_text(18 + CELL / 2, query_y + CELL / 2 + 4, "q5"))
    parts.append(f"<path d='M{18 + CELL + 4:g} {query_y + CELL / 2:g}H{left - 112:g}' "
                 f"stroke='{INK}' marker-end='url(#arrow)'/>")
    # Brackets under the values: what came from the cache, what was appended.
    bottom = top + 3 * CELL + 2 * 12
    for start, stop, label in ((0, 5, "from the cache (B, H, T_past, d)"), (5, 6, "appended")):
        x0, x1 = left + start * CELL + 3, left + stop * CELL - 3
        parts.append(f"<path d='M{x0:g} {bottom + 6:g}V{bottom + 12:g}H{x1:g}V{bottom + 6:g}' "
                     f"fill='none' stroke='{INK}'/>")
        parts.append(_text((x0 + x1) / 2, bottom + 27, label, fill=INK))
    notes = [
        "q5 is the only query: softmax(q5 · k_j / √d) over j = 0..5, no mask needed for one token",
        "output = Σ_j weight_j · v_j, the last row of full causal attention over the six tokens",
        "returned cache: (k0..k5, v0..v5), ready for the next token",
    ]
    for n, line in enumerate(notes):
        parts.append(_text(18, bottom + 56 + n * 18, line, anchor="start"))
    width = left + size * CELL + 150
    defs = ("<defs><marker id='arrow' markerWidth='8' markerHeight='8' refX='7' refY='4' "
            f"orient='auto'><path d='M0 0L8 4L0 8z' fill='{INK}'/></marker></defs>")
    return svg_document(width, bottom + 56 + len(notes) * 18, [defs, *parts])


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/04_causal_attention/figures/``."""
    return {
        "causal_mask.svg": causal_mask_svg(),
        "alignment.svg": alignment_svg(),
        "kv_cache_step.svg": kv_cache_step_svg(),
    }
