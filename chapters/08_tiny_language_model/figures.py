"""Draws the figures of chapter 8: ``figures()`` returns each SVG by its name in ``figures/``.

* ``architecture.svg``: the tiny language model from bottom to top, tokens
  to logits, with the shape of the tensor between every two stages and the
  pre-norm block drawn open: each sub-layer reads a LayerNorm of the
  residual stream and adds its answer back to it.
* ``generation.svg``: greedy generation with the KV cache, one call of
  ``forward_with_cache`` a row: the prompt once, then one new token a step;
  which positions each call reads from the cache and which it computes, the
  rows of ``pos_emb`` the new tokens get, and the cache's length after it.

Nothing random and no import of the reference solution, which students do
not receive.
"""

from grader.figures import MUTED, TEXT, line, svg_document, text

STREAM = "#1f77b4"
BOX_FILL = {"embed": "#e8f1fb", "norm": "#fdf2e0", "attn": "#fbe5e1", "mlp": "#e6f4e6", "head": "#efe8f7"}


def _box(x: float, y: float, width: float, height: float, label: str, kind: str) -> list[str]:
    return [f"<rect x='{x:.1f}' y='{y:.1f}' width='{width:.1f}' height='{height:.1f}' rx='6' "
            f"fill='{BOX_FILL[kind]}' stroke='{TEXT}' stroke-width='1'/>",
            text(x + width / 2, y + height / 2 + 4, label)]


def _add(x: float, y: float) -> list[str]:
    """The residual stream's "+": a sub-layer's answer joins the stream here."""
    return [f"<circle cx='{x:.1f}' cy='{y:.1f}' r='9' fill='white' stroke='{STREAM}' stroke-width='2'/>",
            text(x, y + 5, "+", size=15, colour=STREAM, bold=True)]


def architecture_svg() -> str:
    width, height = 700, 660
    stream_x, box_w, box_h = 200, 200, 30
    body = [
        text(width / 2, 24, "TinyLM: tokens in at the bottom, next-token logits out at the top",
             size=14, bold=True),
    ]
    # From the top down, the stages and the shape that leaves each one.
    top, bottom = 60, 600
    body.append(line(stream_x, bottom - 40, stream_x, top + 40, STREAM, 3))  # the residual stream
    body += _box(stream_x - box_w / 2, top, box_w, box_h, "head: Linear(D, V)", "head")
    body.append(text(stream_x + box_w / 2 + 12, top + 19, "logits (B, T, V)", anchor="start", colour=MUTED))
    body += _box(stream_x - box_w / 2, top + 50, box_w, box_h, "ln_f: LayerNorm(D)", "norm")
    # One block, drawn open, repeated num_layers times.
    block_top, block_bottom = top + 110, top + 430
    body.append(f"<rect x='{stream_x - 150}' y='{block_top}' width='{620}' height='{block_bottom - block_top}' "
                f"rx='10' fill='none' stroke='{MUTED}' stroke-dasharray='6 4'/>")
    body.append(text(stream_x + 460, block_top + 20, "TransformerBlock", anchor="end", colour=MUTED, bold=True))
    body.append(text(stream_x + 460, block_top + 36, "x num_layers", anchor="end", colour=MUTED))
    side_x = stream_x + 130  # the sub-layers sit beside the stream
    for index, (label_norm, label_layer, kind, note) in enumerate((
        ("ln2: LayerNorm(D)", "mlp: Linear, GELU, Linear", "mlp", "(B, T, 4D) inside"),
        ("ln1: LayerNorm(D)", "causal attention, H heads", "attn", "qkv, mask, softmax, proj"),
    )):
        y0 = block_top + 50 + index * 140
        join = y0 + 10
        body += _add(stream_x, join)
        body.append(line(stream_x, y0 + 110, side_x, y0 + 110))  # out of the stream ...
        body.append(line(side_x, y0 + 110, side_x, y0 + 95))
        body += _box(side_x - 85, y0 + 65, 170, box_h, label_norm, "norm")  # ... through the norm ...
        body += _box(side_x - 85, y0 + 20, 170, box_h, label_layer, kind)  # ... and the sub-layer ...
        body.append(line(side_x, y0 + 20, side_x, join))
        body.append(line(side_x, join, stream_x + 9, join))  # ... back into the stream
        body.append(text(side_x + 92, y0 + 40, note, anchor="start", size=10, colour=MUTED))
    body += _box(stream_x - box_w / 2, block_bottom + 30, box_w, box_h, "tok_emb + pos_emb", "embed")
    body.append(text(stream_x - box_w / 2 - 10, block_bottom + 20, "x (B, T, D)", anchor="end", colour=STREAM))
    body.append(text(stream_x - box_w / 2 - 10, block_top - 6, "x (B, T, D)", anchor="end", colour=STREAM))
    body.append(text(stream_x, bottom - 14, "tokens (B, T), integers 0 .. V - 1", colour=MUTED))
    body.append(text(20, height - 28, "pre-norm: each sub-layer reads LayerNorm(x) and adds its answer to x;",
                     anchor="start", size=11, colour=MUTED))
    body.append(text(20, height - 12, "the stream itself is normalised only by ln_f, before the head",
                     anchor="start", size=11, colour=MUTED))
    return svg_document(width, height, body)


CACHED, NEW, PICKED = "#d9d9d9", "#fd8d3c", "#9ecae1"


def generation_svg() -> str:
    """Four calls of forward_with_cache: a prompt of four characters, then three new ones."""
    prompt, new_tokens = list("the "), list("cat")
    cell, left, top = 40, 250, 92
    width, height = 720, 430
    body = [
        text(width / 2, 24, "greedy generation with the KV cache: one call of forward_with_cache a row",
             size=14, bold=True),
        text(left + 3.5 * cell, top - 40, "positions (one character each)", colour=MUTED),
    ]
    for position in range(len(prompt) + len(new_tokens)):
        body.append(text(left + position * cell + cell / 2, top - 12, str(position)))
    calls = [("forward_with_cache(prompt)", "T_past = 0: pos_emb rows 0..3", "cache: 4 positions")]
    calls += [(f"forward_with_cache(token, cache)", f"T_past = {4 + step}: pos_emb row {4 + step}",
               f"cache: {5 + step} positions") for step in range(len(new_tokens))]
    for row, (call, positions, after) in enumerate(calls):
        y = top + row * (cell + 26)
        body.append(text(left - 12, y + cell / 2 - 2, call, anchor="end"))
        body.append(text(left - 12, y + cell / 2 + 14, positions, anchor="end", size=11, colour=MUTED))
        past = 0 if row == 0 else len(prompt) + row - 1
        length = len(prompt) if row == 0 else 1
        for position in range(past + length):
            char = (prompt + new_tokens)[position]
            fill = CACHED if position < past else NEW
            body.append(f"<rect x='{left + position * cell}' y='{y}' width='{cell}' height='{cell}' "
                        f"fill='{fill}' stroke='white'/>")
            body.append(text(left + position * cell + cell / 2, y + cell / 2 + 5, "␣" if char == " " else char))
        # The logits of the call's last position choose the next character.
        chosen = past + length
        if chosen < len(prompt) + len(new_tokens):
            body.append(f"<rect x='{left + chosen * cell + 4}' y='{y + 4}' width='{cell - 8}' height='{cell - 8}' "
                        f"fill='none' stroke='{STREAM}' stroke-width='2' stroke-dasharray='4 3'/>")
            body.append(text(left + chosen * cell + cell / 2, y + cell / 2 + 5, new_tokens[row], colour=STREAM))
        body.append(text(left + 7 * cell + 12, y + cell / 2 + 5, after, anchor="start", colour=MUTED))
    legend_y = top + len(calls) * (cell + 26) + 6
    for index, (fill, words) in enumerate(((CACHED, "keys and values read from the cache, not recomputed"),
                                           (NEW, "computed by this call: its queries, and keys and values "
                                                 "appended to the cache"))):
        y = legend_y + index * 20
        body.append(f"<rect x='20' y='{y - 11}' width='14' height='14' fill='{fill}'/>")
        body.append(text(42, y + 1, words, anchor="start", size=11))
    body.append(f"<rect x='20' y='{legend_y + 29}' width='14' height='14' fill='none' stroke='{STREAM}' "
                f"stroke-width='2' stroke-dasharray='4 3'/>")
    body.append(text(42, legend_y + 41, "the next character: argmax of the logits of the call's last position, "
                     "the input of the next call", anchor="start", size=11))
    return svg_document(width, height, body)


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/08_tiny_language_model/figures/``."""
    return {"architecture.svg": architecture_svg(), "generation.svg": generation_svg()}
