"""Draws the figures of chapter 3: ``figures()`` returns each SVG by its name in ``figures/``.

* ``split_heads.svg``: the features of a ``(T, D) = (4, 6)`` input dealt out
  to ``H = 3`` heads by ``split_heads``, next to what a reshape without the
  transpose does to the same numbers.
* ``head_patterns.svg``: the attention weights of three heads of one layer
  on the same six tokens. The projections are written by hand (no
  randomness, so the figure is the same on every machine) so that each head
  finds a different pattern: the previous token, the token itself, the
  first token.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

import torch

from grader.figures import blue, svg_document

TOKENS = ["the", "cat", "sat", "on", "the", "mat"]
# One light fill and one dark ink per head: blue, orange, green.
HEAD_FILLS = ["#c6dbef", "#fdd0a2", "#c7e9c0"]
HEAD_INKS = ["#08519c", "#a63603", "#006d2c"]


def _text(x: float, y: float, text: str, size: int = 12, anchor: str = "middle",
          fill: str = "black", weight: str = "normal") -> str:
    """One line of words at ``(x, y)``. Not ``grader.figures.text``: this
    chapter's figures were drawn with whole-pixel ``:g`` numbers and every
    attribute written out, and they must stay byte for byte as they are."""
    return (f"<text x='{x:g}' y='{y:g}' font-size='{size}' text-anchor='{anchor}' fill='{fill}' "
            f"font-weight='{weight}'>{escape(text)}</text>")


# -- split_heads.svg ---------------------------------------------------------------

T, D, H = 4, 6, 3
WIDTH = D // H  # d = 2 features per head
CELL_W, CELL_H = 44, 26


def _cell(x: float, y: float, token: int, feature: int) -> str:
    """One number of x, coloured by the head that owns its feature, labelled
    with where it came from: token t, feature f."""
    head = feature // WIDTH
    return (f"<rect x='{x:g}' y='{y:g}' width='{CELL_W}' height='{CELL_H}' fill='{HEAD_FILLS[head]}' "
            f"stroke='white' stroke-width='2'/>"
            + _text(x + CELL_W / 2, y + CELL_H / 2 + 4, f"t{token}·f{feature}", 11, fill=HEAD_INKS[head]))


def _heads_panel(x0: float, y0: float, heads: torch.Tensor, title: str, note: str) -> list[str]:
    """Three (T, d) grids side by side; ``heads[h, t, j]`` is the flat index
    ``token * D + feature`` of the number that landed there."""
    parts = [_text(x0, y0, title, 13, anchor="start", weight="bold"),
             _text(x0, y0 + 17, note, 11, anchor="start", fill="#555")]
    top = y0 + 46
    for h in range(H):
        left = x0 + 28 + h * (WIDTH * CELL_W + 34)
        parts.append(_text(left + WIDTH * CELL_W / 2, top - 8, f"head {h}", 12, fill=HEAD_INKS[h],
                           weight="bold"))
        for t in range(T):
            if h == 0:
                parts.append(_text(x0 + 20, top + t * CELL_H + CELL_H / 2 + 4, f"row {t}", 10,
                                   anchor="end", fill="#555"))
            for j in range(WIDTH):
                token, feature = divmod(int(heads[h, t, j]), D)
                parts.append(_cell(left + j * CELL_W, top + t * CELL_H, token, feature))
    return parts


def split_heads_svg() -> str:
    """x (T, D), then split_heads(x, H) and the reshape-only mistake."""
    index = torch.arange(T * D).reshape(T, D)  # each number remembers where it came from
    right = index.reshape(T, H, WIDTH).transpose(0, 1)  # (H, T, d): split_heads
    wrong = index.reshape(H, T, WIDTH)  # (H, T, d) straight from memory: the bug
    parts = [_text(16, 22, "x: (T, D) = (4, 6), feature colours = the head that owns them", 13,
                   anchor="start", weight="bold")]
    top = 58
    for f in range(D):
        parts.append(_text(60 + f * CELL_W + CELL_W / 2, top - 8, f"f{f}", 11, fill="#555"))
    for t in range(T):
        parts.append(_text(52, top + t * CELL_H + CELL_H / 2 + 4, f"token {t}", 11, anchor="end",
                           fill="#555"))
        for f in range(D):
            parts.append(_cell(60 + f * CELL_W, top + t * CELL_H, t, f))
    parts += _heads_panel(16, 196, right, "split_heads(x, 3): (H, T, d) = (3, 4, 2)",
                          "reshape to (T, H, d), then transpose(-3, -2): row t of every head is token t")
    parts += _heads_panel(16, 384, wrong, "wrong: x.reshape(3, 4, 2), no transpose",
                          "same shape, but head 0 holds tokens 0 and 1, and its rows mix features")
    return svg_document(480, 536, parts)


# -- head_patterns.svg -------------------------------------------------------------

PATTERNS = ["previous token", "same token", "first token"]


def head_weights() -> torch.Tensor:
    """Causal self-attention weights of three hand-made heads: (H, T, T).

    The tokens are one-hot positions, x = I (T, T), so a projection can point
    a query or a key at any position. Head 0's keys are shifted by one
    (key s looks like position s + 1), so query t matches key t - 1; head 1
    matches each query with its own key; head 2 sends every query to
    position 0 and gives only key 0 anything to match.
    """
    size = len(TOKENS)
    x = torch.eye(size)  # (T, D_in): one-hot positions
    eye, shift = torch.eye(size), torch.eye(size).roll(1, dims=0)  # shift @ e_s = e_{s+1}
    first = torch.zeros(size, size)
    first[0, 0] = 1.0
    w_q = torch.stack([eye, eye, torch.zeros(size, size).index_fill(0, torch.tensor([0]), 1.0)])
    w_k = torch.stack([shift, eye, first])  # (H, d, D_in), with d = D_in = T
    strength = 3.13  # scaled scores of about 3.13**2 / sqrt(6) = 4 for a match
    q = x @ (strength * w_q).transpose(-2, -1)  # (H, T, d)
    k = x @ (strength * w_k).transpose(-2, -1)  # (H, T, d)
    scores = q @ k.transpose(-2, -1) / size ** 0.5  # (H, T, T)
    causal = torch.ones(size, size, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)


def head_patterns_svg() -> str:
    """One small heatmap per head, masked cells grey."""
    weights = head_weights()
    size, cell, label, gap = len(TOKENS), 32, 40, 34
    panel = label + size * cell
    width = 16 + 3 * panel + 2 * gap
    top = 84
    parts = [_text(width / 2, 22, "Three heads of one layer on the same tokens (causal mask)", 14,
                   weight="bold"),
             _text(width / 2, 40, "rows: queries, columns: keys; each row sums to 1", 11, fill="#555")]
    for h, pattern in enumerate(PATTERNS):
        x0 = 16 + h * (panel + gap) + label
        parts.append(_text(x0 + size * cell / 2, 62, f"head {h}: {pattern}", 12, weight="bold",
                           fill=HEAD_INKS[h]))
        for j, token in enumerate(TOKENS):
            parts.append(_text(x0 + j * cell + cell / 2, top - 6, token, 10))
        for i, token in enumerate(TOKENS):
            y = top + i * cell
            parts.append(_text(x0 - 5, y + cell / 2 + 4, token, 10, anchor="end"))
            for j in range(size):
                x = x0 + j * cell
                if j > i:  # masked: a future token
                    parts.append(f"<rect x='{x}' y='{y}' width='{cell}' height='{cell}' "
                                 "fill='#e5e5e5' stroke='white'/>")
                    continue
                weight = float(weights[h, i, j])
                ink = "white" if weight > 0.5 else "black"
                parts.append(f"<rect x='{x}' y='{y}' width='{cell}' height='{cell}' "
                             f"fill='{blue(weight)}' stroke='white'/>"
                             + _text(x + cell / 2, y + cell / 2 + 4, f"{weight:.2f}", 9, fill=ink))
    return svg_document(width, top + size * cell + 16, parts)


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/03_multi_head_attention/figures/``."""
    return {"split_heads.svg": split_heads_svg(), "head_patterns.svg": head_patterns_svg()}
