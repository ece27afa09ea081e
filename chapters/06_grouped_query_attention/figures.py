"""Draws the figures of chapter 6: ``figures()`` returns each SVG by its name in ``figures/``.

Everything is computed here from the chapter's formulas (no randomness, and
no import of the reference solution, which students do not receive):

* ``grouping.svg``: eight query heads and the K/V heads they read in
  multi-head (8 K/V heads), grouped-query (2) and multi-query (1) attention;
* ``repeat_vs_interleave.svg``: which K/V head each of six query heads gets
  from ``repeat_interleave`` (0, 0, 0, 1, 1, 1: right) and from ``repeat``
  (0, 1, 0, 1, 0, 1: wrong);
* ``kv_cache.svg``: the KV cache of a LLaMA-3-8B-like model (32 layers, 32
  query heads of width 128, bfloat16) for 8 sequences of 8192 tokens, with
  32, 8 and 1 K/V heads, next to the size of its weights.
"""

from grader.figures import MUTED, TEXT, line, svg_document, text

# One colour a K/V head (up to 8), used by every figure.
KV_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WRONG = "#c0392b"
RIGHT = "#1e8449"


def _box(centre_x: float, y: float, width: float, height: float, label: str, colour: str,
         filled: bool = False) -> str:
    """A labelled box, tinted (or filled, for K/V heads) with ``colour``."""
    opacity = "0.85" if filled else "0.15"
    ink = "white" if filled else TEXT
    return (f"<rect x='{centre_x - width / 2:.1f}' y='{y:.1f}' width='{width}' height='{height}' rx='4' "
            f"fill='{colour}' fill-opacity='{opacity}' stroke='{colour}' stroke-width='2'/>"
            + text(centre_x, y + height / 2 + 4, label, colour=ink, size=12))


# -- grouping.svg --------------------------------------------------------------------------

QUERY_HEADS = 8
BOX_W, BOX_H, GAP = 50, 28, 14


def _query_x(left: float, head: int) -> float:
    return left + head * (BOX_W + GAP) + BOX_W / 2


def _grouping_panel(top: float, num_kv_heads: int, title: str, note: str) -> list[str]:
    """Eight query heads over their K/V heads; query head h reads K/V head h // group."""
    left = 190
    group = QUERY_HEADS // num_kv_heads
    query_y, kv_y = top + 10, top + 78
    parts = [text(20, top + 38, title, anchor="start", bold=True),
             text(20, top + 56, note, anchor="start", size=11, colour=MUTED)]
    for j in range(num_kv_heads):
        members = [_query_x(left, h) for h in range(j * group, (j + 1) * group)]
        centre = sum(members) / len(members)  # under the middle of its group
        colour = KV_COLOURS[j]
        for x in members:
            parts.append(line(x, query_y + BOX_H, centre, kv_y, colour, width=2))
        parts.append(_box(centre, kv_y, BOX_W + 6, BOX_H, f"kv {j}", colour, filled=True))
    for h in range(QUERY_HEADS):
        parts.append(_box(_query_x(left, h), query_y, BOX_W, BOX_H, f"q {h}", KV_COLOURS[h // group]))
    return parts


def grouping_svg() -> str:
    width, height = 720, 430
    body = [text(width / 2, 22, "Eight query heads and the K/V heads they read: "
                 "query head h uses K/V head h // group", size=14, bold=True)]
    body += _grouping_panel(40, 8, "multi-head", "H_kv = 8, groups of 1")
    body += _grouping_panel(160, 2, "grouped-query", "H_kv = 2, groups of 4")
    body += _grouping_panel(280, 1, "multi-query", "H_kv = 1, one group")
    body.append(text(20, height - 12, "The KV cache holds the filled boxes only: 8, 2 or 1 heads of "
                     "keys and values per layer and token.", anchor="start", colour=MUTED))
    return svg_document(width, height, body)


# -- repeat_vs_interleave.svg ---------------------------------------------------------------------


def _expanded_row(top: float, kv_heads: list[int], group: int, title: str, verdict: str,
                  ok: bool) -> list[str]:
    """Query heads in their groups, each labelled with the K/V head an expansion gave it."""
    left = 200
    parts = [text(20, top + 26, title, anchor="start", bold=True),
             text(20, top + 44, verdict, anchor="start", size=11, colour=RIGHT if ok else WRONG)]
    for h, j in enumerate(kv_heads):
        x = _query_x(left, h)
        parts.append(_box(x, top + 8, BOX_W, BOX_H, f"q {h}", KV_COLOURS[h // group]))
        parts.append(_box(x, top + 50, BOX_W, BOX_H, f"kv {j}", KV_COLOURS[j], filled=True))
        mark_colour = RIGHT if j == h // group else WRONG
        parts.append(line(x, top + 8 + BOX_H, x, top + 50, mark_colour, width=2, dashed=j != h // group))
    return parts


def repeat_vs_interleave_svg() -> str:
    num_kv_heads, num_query_heads = 2, 6
    group = num_query_heads // num_kv_heads
    width, height = 620, 300
    body = [text(width / 2, 22, "Expanding 2 K/V heads to 6 query heads (groups of 3)", size=14, bold=True),
            text(width / 2, 42, "query heads are tinted by their group; the box under each is the "
                 "K/V head it gets", size=11, colour=MUTED)]
    interleaved = [h // group for h in range(num_query_heads)]  # 0, 0, 0, 1, 1, 1
    tiled = [h % num_kv_heads for h in range(num_query_heads)]  # 0, 1, 0, 1, 0, 1
    body += _expanded_row(60, interleaved, group, "repeat_interleave", "0, 0, 0, 1, 1, 1: right", True)
    body += _expanded_row(170, tiled, group, "repeat", "0, 1, 0, 1, 0, 1: wrong", False)
    misread = [f"q {h}" for h in range(num_query_heads) if tiled[h] != interleaved[h]]
    body.append(text(20, height - 12, f"With repeat, {' and '.join(misread)} read the other group's keys "
                     "and values (red dashes).", anchor="start", colour=MUTED))
    return svg_document(width, height, body)


# -- kv_cache.svg ---------------------------------------------------------------------------------

GIB = 2**30
LAYERS, HEAD_DIM, BYTES = 32, 128, 2  # a LLaMA-3-8B-like model (32 query heads) in bfloat16
BATCH, TOKENS = 8, 8192
WEIGHTS_BYTES = 8_030_261_248 * BYTES  # LLaMA 3 8B's parameters, from its config


def cache_bytes(num_kv_heads: int) -> int:
    """2 (a key and a value) x B x T x layers x H_kv x d x bytes per number."""
    return 2 * BATCH * TOKENS * LAYERS * num_kv_heads * HEAD_DIM * BYTES


def kv_cache_svg() -> str:
    rows = [("multi-head, 32 K/V heads", 32), ("grouped-query, 8 K/V heads", 8),
            ("multi-query, 1 K/V head", 1)]
    left, top, plot_w, bar_h, gap = 210, 70, 420, 34, 22
    largest = cache_bytes(32) / GIB
    width, height = left + plot_w + 90, top + len(rows) * (bar_h + gap) + 70

    def x_of(gib: float) -> float:
        return left + plot_w * gib / largest

    body = [text(width / 2, 22, "KV cache of a LLaMA-3-8B-like model: 8 sequences of 8192 tokens",
                 size=14, bold=True),
            text(width / 2, 42, "32 layers, 32 query heads of width 128, bfloat16 (2 bytes a number)",
                 size=11, colour=MUTED)]
    for index, (label, num_kv_heads) in enumerate(rows):
        y = top + index * (bar_h + gap)
        gib = cache_bytes(num_kv_heads) / GIB
        body.append(text(left - 10, y + bar_h / 2 + 4, label, anchor="end"))
        body.append(f"<rect x='{left}' y='{y}' width='{max(x_of(gib) - left, 2):.1f}' height='{bar_h}' "
                    f"fill='{KV_COLOURS[index]}' fill-opacity='0.85'/>")
        body.append(text(x_of(gib) + 8, y + bar_h / 2 + 4, f"{gib:g} GiB", anchor="start", bold=True))
    weights_x = x_of(WEIGHTS_BYTES / GIB)
    bottom = top + len(rows) * (bar_h + gap) - gap
    body.append(line(weights_x, top - 12, weights_x, bottom + 8, MUTED, width=2, dashed=True))
    body.append(text(weights_x, bottom + 26, f"the weights: about {WEIGHTS_BYTES / GIB:.1f} GiB",
                     colour=MUTED))
    body.append(text(20, height - 14, "2 x B x T x layers x H_kv x d x bytes: the cache shrinks by "
                     "H_q / H_kv", anchor="start", colour=MUTED))
    return svg_document(width, height, body)


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/06_grouped_query_attention/figures/``."""
    return {
        "grouping.svg": grouping_svg(),
        "repeat_vs_interleave.svg": repeat_vs_interleave_svg(),
        "kv_cache.svg": kv_cache_svg(),
    }
