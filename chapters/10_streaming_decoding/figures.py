"""Draws the figures of chapter 10: ``figures()`` returns each SVG by its name in ``figures/``.

* ``sink_window_mask.svg``: the mask of 11 tokens with a window of 4 and 2
  sinks (``sliding_window_mask(11, 11, 4, 2)``): which keys each token sees,
  the sinks in orange, the window in blue.
* ``rolling_buffer.svg``: the buffer of 6 slots (2 sinks, a window of 4)
  after tokens 0..10: which token each slot holds (its position in the
  text), the position each key gets within the cache (StreamingLLM), and
  where the next token goes.

Both are computed from fixed numbers with plain integers (no randomness, no
torch), so the build writes the same bytes on every machine; the rule is the
chapter's, written again here so that drawing needs no solution.
"""

from grader.figures import CELL, MUTED, TEXT, svg_document, text

WINDOW_COLOUR = "#6baed6"  # a key inside the query's window
SINK_COLOUR = "#fd8d3c"  # a sink: one of the first tokens, always seen
NEW_COLOUR = "#74c476"  # the token just written
SMALL = 34  # the side of one cell of the mask, which has 11 columns


def _sees(position: int, key: int, window: int, sinks: int) -> str | None:
    """``"window"``, ``"sink"`` or None: why token ``position`` sees ``key``."""
    if key > position:
        return None
    if key > position - window:
        return "window"
    return "sink" if key < sinks else None


def _cell(x: float, y: float, fill: str, side: float = SMALL) -> str:
    return f"<rect x='{x:g}' y='{y:g}' width='{side:g}' height='{side:g}' fill='{fill}' stroke='white'/>"


def _blocked(x: float, y: float) -> str:
    return f"<rect x='{x:g}' y='{y:g}' width='{SMALL}' height='{SMALL}' fill='#eeeeee' stroke='white'/>"


def sink_window_mask_svg(length: int = 11, window: int = 4, sinks: int = 2) -> str:
    left, top = 80, 92
    width = max(left + length * SMALL + 24, 560)  # room for the subtitle and the legend
    parts = [
        text(width / 2, 22, f"sliding_window_mask({length}, {length}, {window}, {sinks})", size=14, bold=True),
        text(width / 2, 42, f"token p sees keys p - {window - 1} .. p (a window of {window}, itself included) "
                            f"and the {sinks} sinks", colour=MUTED),
        text(left + length * SMALL / 2, 64, "keys (tokens of the text)", colour=MUTED),
    ]
    for j in range(length):
        parts.append(text(left + j * SMALL + SMALL / 2, top - 8, str(j)))
    for i in range(length):
        parts.append(text(left - 8, top + i * SMALL + SMALL / 2 + 4, f"token {i}", anchor="end"))
        for j in range(length):
            why = _sees(i, j, window, sinks)
            x, y = left + j * SMALL, top + i * SMALL
            if why is None:
                parts.append(_blocked(x, y))
            else:
                parts.append(_cell(x, y, WINDOW_COLOUR if why == "window" else SINK_COLOUR))
    bottom = top + length * SMALL + 28
    parts += [
        _cell(left, bottom - 12, WINDOW_COLOUR, 14), text(left + 20, bottom, "in the window", anchor="start"),
        _cell(left + 130, bottom - 12, SINK_COLOUR, 14),
        text(left + 150, bottom, "a sink (older than the window)", anchor="start"),
        _cell(left + 350, bottom - 12, "#eeeeee", 14), text(left + 370, bottom, "not seen", anchor="start"),
    ]
    return svg_document(width, bottom + 16, parts)


def _slot_tokens(count: int, capacity: int, sinks: int) -> list[int]:
    """The token each slot holds after tokens 0 .. count - 1 (-1: empty)."""
    held = [-1] * capacity
    for t in range(count):
        held[t if t < sinks else sinks + (t - sinks) % (capacity - sinks)] = t
    return held


def rolling_buffer_svg(count: int = 11, capacity: int = 6, sinks: int = 2) -> str:
    held = _slot_tokens(count, capacity, sinks)
    newest = held.index(count - 1)
    order = sorted(range(capacity), key=lambda slot: held[slot])
    positions = [order.index(slot) for slot in range(capacity)]
    left, top = 190, 96
    width = max(left + capacity * CELL + 40, 680)  # room for the notes
    parts = [
        text(width / 2, 22, f"the rolling buffer after tokens 0..{count - 1}: {capacity} slots, "
                            f"{sinks} sinks, a window of {capacity - sinks}", size=14, bold=True),
        text(width / 2, 42, f"token t >= {sinks} goes to slot {sinks} + (t - {sinks}) % {capacity - sinks}: "
                            f"token {count - 1} replaced token {count - 1 - (capacity - sinks)}", colour=MUTED),
    ]
    for slot in range(capacity):
        parts.append(text(left + slot * CELL + CELL / 2, top - 10, f"slot {slot}"))
    rows = [
        ("token held (text position)", [str(token) for token in held]),
        ("position within the cache", [str(position) for position in positions]),
    ]
    for r, (label, values) in enumerate(rows):
        y = top + r * (CELL + 10)
        parts.append(text(left - 12, y + CELL / 2 + 4, label, anchor="end"))
        for slot, value in enumerate(values):
            x = left + slot * CELL
            if r == 0:
                fill = SINK_COLOUR if slot < sinks else (NEW_COLOUR if slot == newest else WINDOW_COLOUR)
                parts.append(_cell(x, y, fill, CELL))
            else:
                parts.append(f"<rect x='{x:g}' y='{y:g}' width='{CELL}' height='{CELL}' fill='white' "
                             f"stroke='#bbbbbb'/>")
            parts.append(text(x + CELL / 2, y + CELL / 2 + 4, value, bold=r == 1))
    bottom = top + len(rows) * (CELL + 10) + 14
    notes = [
        (f"RoPE rotates each held key by its cache position (the {capacity} tokens in text order get "
         f"0..{capacity - 1}),"),
        f"and the query, token {count - 1}, by {capacity - 1}: StreamingLLM's positions, not the text's.",
        (f"The next token, {count}, goes to slot {sinks + (count - sinks) % (capacity - sinks)} and replaces "
         f"token {count - (capacity - sinks)}, the oldest of the window."),
    ]
    for n, line in enumerate(notes):
        parts.append(text(24, bottom + 14 + n * 18, line, anchor="start", colour=TEXT))
    return svg_document(width, bottom + 14 + len(notes) * 18 + 10, parts)


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/10_streaming_decoding/figures/``."""
    return {
        "sink_window_mask.svg": sink_window_mask_svg(),
        "rolling_buffer.svg": rolling_buffer_svg(),
    }
