"""Draws the figures of chapter 12: ``figures()`` returns each SVG by its name in ``figures/``.

Everything is computed here from the chapter's formulas and DeepSeek-V2's
published dimensions (no randomness, and no import of the reference
solution, which students do not receive):

* ``mla_dataflow.svg``: where a token's keys and values come from in MLA:
  ``h`` down to the latent ``c_KV`` and up to every head's content key and
  value; ``h`` to the one rope key shared by the heads; the two boxes a
  decoder caches drawn filled;
* ``cache_per_token.svg``: the numbers one token caches in one layer of a
  DeepSeek-V2-shaped layer (128 heads of width 128): multi-head attention
  (2 x 128 x 128 = 32768), grouped-query attention with 8 K/V heads (2048),
  MLA (512 + 64 = 576) and multi-query attention (256).
"""

from grader.figures import MUTED, TEXT, line, svg_document, text

CACHED = "#1f77b4"
COMPUTED = "#ff7f0e"
ROPE = "#2ca02c"


def _box(x: float, y: float, width: float, height: float, label: str, colour: str,
         filled: bool = False, note: str = "") -> list[str]:
    """A labelled box whose top-left corner is ``(x, y)``; filled boxes are what is cached."""
    opacity = "0.85" if filled else "0.15"
    ink = "white" if filled else TEXT
    parts = [(f"<rect x='{x:.1f}' y='{y:.1f}' width='{width}' height='{height}' rx='4' fill='{colour}' "
              f"fill-opacity='{opacity}' stroke='{colour}' stroke-width='2'/>"),
             text(x + width / 2, y + height / 2 + (0 if note else 4), label, colour=ink, bold=filled)]
    if note:
        parts.append(text(x + width / 2, y + height / 2 + 15, note, colour=ink, size=10))
    return parts


# -- mla_dataflow.svg ------------------------------------------------------------------------


def mla_dataflow_svg() -> str:
    width, height = 720, 452
    body = [text(width / 2, 22, "MLA's keys and values for one token: what is cached, and what is computed from it",
                 size=14, bold=True)]
    columns = [(40, "head 0"), (280, "head 1"), (520, "head H-1")]
    # The lines first, under the boxes: h to the latent and the rope key, those to every head.
    body.append(line(360, 92, 215, 130, TEXT, width=1.5))
    body.append(line(360, 92, 545, 130, TEXT, width=1.5))
    for x, _ in columns:
        body.append(line(215, 182, x + 60, 260, COMPUTED, width=1.5))
        body.append(line(545, 182, x + 100, 260, ROPE, width=1.5))
    body += _box(310, 48, 100, 44, "h", TEXT, note="(D,)")
    body += _box(130, 130, 170, 52, "c_KV = W_DKV h", CACHED, filled=True, note="(d_c,)")
    body += _box(445, 130, 200, 52, "k_R = RoPE(W_KR h)", ROPE, filled=True, note="(d_R,), one for all heads")
    for x, name in columns:
        body += _box(x, 260, 160, 46, "key [W_UK_h c_KV; k_R]", COMPUTED, note="(d_h + d_R,)")
        body += _box(x, 314, 160, 46, "value W_UV_h c_KV", COMPUTED, note="(d_h,)")
        body.append(text(x + 80, 376, name, bold=True))
    body.append(text(460, 290, "...", size=16))
    body.append(text(20, 404, "Filled: the cache, d_c + d_R numbers a token and layer (DeepSeek-V2: 512 + 64 = 576). "
                     "Tinted: made from it.", anchor="start", size=11))
    body.append(text(20, 422, "Absorbing W_UK into the query and W_UV into the output lets a decoder score and "
                     "sum the latents", anchor="start", size=11, colour=MUTED))
    body.append(text(20, 438, "directly, never making the tinted boxes of a cached token.", anchor="start", size=11,
                     colour=MUTED))
    return svg_document(width, height, body)


# -- cache_per_token.svg -------------------------------------------------------------------------

HEADS, HEAD_DIM, KV_RANK, ROPE_DIM = 128, 128, 512, 64  # DeepSeek-V2 (section 3.1.2 of its paper)


def cache_per_token_svg() -> str:
    rows = [("multi-head, 128 K/V heads", 2 * HEADS * HEAD_DIM, None),
            ("grouped-query, 8 K/V heads", 2 * 8 * HEAD_DIM, None),
            ("latent (MLA), d_c + d_R", KV_RANK + ROPE_DIM, KV_RANK),
            ("multi-query, 1 K/V head", 2 * HEAD_DIM, None)]
    left, top, plot_w, bar_h, gap = 220, 70, 400, 32, 20
    largest = rows[0][1]
    width, height = left + plot_w + 130, top + len(rows) * (bar_h + gap) + 50

    def bar_width(count: float) -> float:
        return max(plot_w * count / largest, 2.0)

    body = [text(width / 2, 22, "Numbers one token caches in one layer, 128 heads of width 128", size=14, bold=True),
            text(width / 2, 42, "DeepSeek-V2's layer shape; the bytes are these times 2 in bfloat16",
                 size=11, colour=MUTED)]
    for index, (label, count, latent) in enumerate(rows):
        y = top + index * (bar_h + gap)
        body.append(text(left - 10, y + bar_h / 2 + 4, label, anchor="end"))
        if latent is None:
            body.append(f"<rect x='{left}' y='{y}' width='{bar_width(count):.1f}' height='{bar_h}' "
                        f"fill='{COMPUTED}' fill-opacity='0.85'/>")
        else:  # the latent and the rope key, side by side
            body.append(f"<rect x='{left}' y='{y}' width='{bar_width(latent):.1f}' height='{bar_h}' "
                        f"fill='{CACHED}' fill-opacity='0.85'/>")
            body.append(f"<rect x='{left + bar_width(latent):.1f}' y='{y}' width='{bar_width(count - latent):.1f}' "
                        f"height='{bar_h}' fill='{ROPE}' fill-opacity='0.85'/>")
        share = f"{count:,} ({count / largest:.2%})"
        body.append(text(left + bar_width(count) + 8, y + bar_h / 2 + 4, share, anchor="start", bold=True))
    body.append(text(20, height - 14, "MLA caches as much as grouped-query attention with 2.25 K/V heads "
                     "(576 = 2 x 2.25 x 128).", anchor="start", colour=MUTED))
    return svg_document(width, height, body)


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/12_latent_attention/figures/``."""
    return {
        "mla_dataflow.svg": mla_dataflow_svg(),
        "cache_per_token.svg": cache_per_token_svg(),
    }
