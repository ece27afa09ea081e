"""Draws the figures of chapter 2: ``figures()`` returns each SVG by its name in ``figures/``.

Everything is hand-made, with no randomness, so the figures are the same on
every machine:

* a padded batch of three sentences, with the padding mask it gives;
* one small mask written in the three conventions of the lesson;
* the cross-attention weights of a three-word French sentence reading a
  padded English one, without and with the padding mask.
"""

from xml.sax.saxutils import escape

import torch

from grader.figures import CELL, heatmap_svg, svg_document

REAL = "#c6dbef"  # a real token, or a pair that may attend
PADDING = "#d9d9d9"  # a padded token, or a pair that is hidden
INK = "#555"

# -- a padded batch ------------------------------------------------------------------

SENTENCES = [["the", "cat", "sleeps"], ["a", "dog", "barks", "at", "night"], ["birds", "sing"]]
WIDE = 70  # a cell wide enough for a word


def padded_batch_svg() -> str:
    """Three sentences padded to the longest, each cell marked real or padding."""
    lengths = [len(words) for words in SENTENCES]
    batch, keys = len(SENTENCES), max(lengths)
    left, top = 150, 78
    width, height = left + keys * WIDE + 20, top + batch * CELL + 60
    parts = [
        f"<text x='{width / 2}' y='20' text-anchor='middle' font-size='14' font-weight='bold'>"
        f"a padded batch: lengths = {tuple(lengths)}, S = {keys}</text>",
        f"<text x='{left + keys * WIDE / 2}' y='46' text-anchor='middle' fill='{INK}'>"
        "position s</text>",
    ]
    for s in range(keys):
        parts.append(f"<text x='{left + s * WIDE + WIDE / 2}' y='{top - 10}' "
                     f"text-anchor='middle'>{s}</text>")
    for b, words in enumerate(SENTENCES):
        y = top + b * CELL
        parts.append(f"<text x='{left - 10}' y='{y + CELL / 2 + 4}' text-anchor='end'>"
                     f"sequence {b} (length {len(words)})</text>")
        for s in range(keys):
            x = left + s * WIDE
            real = s < len(words)
            word = words[s] if real else "<pad>"
            parts.append(
                f"<rect x='{x}' y='{y}' width='{WIDE}' height='{CELL}' "
                f"fill='{REAL if real else PADDING}' stroke='white' stroke-width='2'/>"
                f"<text x='{x + WIDE / 2}' y='{y + 20}' text-anchor='middle'"
                f"{'' if real else f' fill={INK!r}'}>{escape(word)}</text>"
                f"<text x='{x + WIDE / 2}' y='{y + 36}' text-anchor='middle' font-size='10' "
                f"fill='{INK}'>{real}</text>"
            )
    parts.append(f"<text x='16' y='{height - 14}' fill='{INK}'>blue: real tokens "
                 "(padding_mask is True); grey: padding (False)</text>")
    return svg_document(width, height, parts)


# -- one mask, three conventions -----------------------------------------------------

# Three queries, four keys; key 3 is padding, and query 0 may not see key 2.
ATTEND = [[True, True, False, False], [True, True, True, False], [True, True, True, False]]
CONVENTION_PANELS = [
    ('"attend" (bool)', "this course, F.scaled_dot_product_attention",
     lambda ok: "True" if ok else "False"),
    ('"block" (bool)', "nn.MultiheadAttention's masks", lambda ok: "False" if ok else "True"),
    ('"additive" (float)', "added to the scores", lambda ok: "0" if ok else "−∞"),
]


def conventions_svg() -> str:
    """The same mask as "attend", "block" and "additive", side by side."""
    rows, columns = len(ATTEND), len(ATTEND[0])
    panel, gap, left, top = columns * CELL, 70, 40, 96
    width = left + len(CONVENTION_PANELS) * panel + (len(CONVENTION_PANELS) - 1) * gap + 20
    height = top + rows * CELL + 50
    parts = [
        f"<text x='{width / 2}' y='20' text-anchor='middle' font-size='14' font-weight='bold'>"
        "one mask, three conventions (3 queries, 4 keys)</text>",
    ]
    for p, (name, used_by, text) in enumerate(CONVENTION_PANELS):
        x0 = left + p * (panel + gap)
        parts.append(f"<text x='{x0 + panel / 2}' y='50' text-anchor='middle' "
                     f"font-weight='bold'>{escape(name)}</text>")
        parts.append(f"<text x='{x0 + panel / 2}' y='66' text-anchor='middle' font-size='10' "
                     f"fill='{INK}'>{escape(used_by)}</text>")
        for j in range(columns):
            parts.append(f"<text x='{x0 + j * CELL + CELL / 2}' y='{top - 8}' text-anchor='middle' "
                         f"font-size='10' fill='{INK}'>k{j}</text>")
        for i in range(rows):
            if p == 0:
                parts.append(f"<text x='{left - 8}' y='{top + i * CELL + CELL / 2 + 4}' "
                             f"text-anchor='end' font-size='10' fill='{INK}'>q{i}</text>")
            for j in range(columns):
                ok = ATTEND[i][j]
                x, y = x0 + j * CELL, top + i * CELL
                parts.append(
                    f"<rect x='{x}' y='{y}' width='{CELL}' height='{CELL}' "
                    f"fill='{REAL if ok else PADDING}' stroke='white' stroke-width='2'/>"
                    f"<text x='{x + CELL / 2}' y='{y + CELL / 2 + 4}' text-anchor='middle'>"
                    f"{text(ok)}</text>"
                )
    parts.append(f"<text x='{left}' y='{height - 16}' fill='{INK}'>blue: the query may attend "
                 "to the key; grey: the key is hidden (k3 is padding)</text>")
    return svg_document(width, height, parts)


# -- cross-attention weights ---------------------------------------------------------

SOURCE = ["the", "cat", "sleeps", "<pad>", "<pad>"]  # the context: an encoded English sentence
TARGET = ["le", "chat", "dort"]  # the queries: the French translation being written
# Hand-made vectors of width 4 ([article, cat, sleep, animal]); the padding is
# zeros. The projections are the identity, so weights = softmax(x c^T / sqrt(4)).
CONTEXT = torch.tensor(
    [
        [2.0, 0.0, 0.0, 0.0],  # the
        [0.0, 2.0, 0.0, 1.0],  # cat
        [0.0, 0.0, 2.0, 1.0],  # sleeps
        [0.0, 0.0, 0.0, 0.0],  # <pad>
        [0.0, 0.0, 0.0, 0.0],  # <pad>
    ]
)
QUERIES = torch.tensor(
    [
        [2.0, 0.0, 0.0, 0.0],  # le
        [0.0, 2.0, 0.0, 0.5],  # chat
        [0.0, 0.5, 2.0, 0.0],  # dort
    ]
)
SOURCE_LENGTH = 3


def cross_weights(masked: bool) -> torch.Tensor:
    """``(L, S)`` weights of the French queries over the English keys."""
    scores = QUERIES @ CONTEXT.T / CONTEXT.shape[-1] ** 0.5  # (L, S)
    if masked:
        real = torch.arange(len(SOURCE)) < SOURCE_LENGTH  # (S,)
        scores = scores.masked_fill(~real, float("-inf"))
    return torch.softmax(scores, dim=-1)


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/02_cross_attention/figures/``."""
    padded = [[j >= SOURCE_LENGTH for j in range(len(SOURCE))] for _ in TARGET]
    return {
        "padded_batch.svg": padded_batch_svg(),
        "mask_conventions.svg": conventions_svg(),
        "cross_attention_unmasked.svg": heatmap_svg(
            cross_weights(False).tolist(), TARGET, SOURCE,
            "no padding mask: the <pad> keys take weight",
        ),
        "cross_attention_weights.svg": heatmap_svg(
            cross_weights(True).tolist(), TARGET, SOURCE,
            "with the padding mask: the padded keys get 0",
            masked=padded,
        ),
    }

