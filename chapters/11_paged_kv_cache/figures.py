"""Draws the figures of chapter 11: ``figures()`` returns each SVG by its name in ``figures/``.

Everything is drawn from the lesson's worked example, written out here (no
randomness, and no import of the reference solution, which students do not
receive): block size 2, a pool of 8 physical blocks, sequence A in blocks
5 and 2 (4 tokens), sequence B in blocks 7 and 4 (3 tokens, one stale slot
after its last), and the free stack ``[0, 3, 1, 6]``, its top on the right.

* ``paged_kv_cache.svg``: the two block tables, the pool, which slot holds
  which token, and the free stack.
"""

from grader.figures import MUTED, TEXT, line, svg_document, text

BLOCK_SIZE = 2
NUM_BLOCKS = 8
# Sequence name -> (its block table, its length, its colour).
SEQUENCES = {"A": ([5, 2], 4, "#1f77b4"), "B": ([7, 4], 3, "#ff7f0e")}
FREE_STACK = [0, 3, 1, 6]  # the top (the next block taken) last
STALE = "#d9d9d9"

SLOT_W, SLOT_H = 44, 30
POOL_LEFT, POOL_TOP = 330, 70


def _slot_box(x: float, y: float, label: str, colour: str, filled: bool) -> str:
    opacity = "0.8" if filled else "1"
    ink = "white" if filled else MUTED
    return (f"<rect x='{x:.1f}' y='{y:.1f}' width='{SLOT_W}' height='{SLOT_H}' fill='{colour}' "
            f"fill-opacity='{opacity}' stroke='white' stroke-width='2'/>"
            + text(x + SLOT_W / 2, y + SLOT_H / 2 + 4, label, colour=ink, size=11))


def _block_y(block: int) -> float:
    return POOL_TOP + block * (SLOT_H + 8)


def _owners() -> dict[tuple[int, int], tuple[str, int, str]]:
    """``{(block, slot): (sequence, token, colour)}`` for every slot a token holds."""
    owned = {}
    for name, (table, length, colour) in SEQUENCES.items():
        for token in range(length):
            owned[(table[token // BLOCK_SIZE], token % BLOCK_SIZE)] = (name, token, colour)
    return owned


def paged_kv_cache_svg() -> str:
    width, height = 820, 420
    body = [text(width / 2, 24, "Block tables map each sequence's logical blocks to physical blocks of one pool",
                 size=14, bold=True),
            text(POOL_LEFT + SLOT_W, POOL_TOP - 14, "the pool: 8 blocks of 2 slots", colour=MUTED, size=11)]
    owned = _owners()
    used = {block for table, _, _ in SEQUENCES.values() for block in table}
    for block in range(NUM_BLOCKS):
        y = _block_y(block)
        body.append(text(POOL_LEFT - 8, y + SLOT_H / 2 + 4, f"block {block}", anchor="end", size=11))
        for slot in range(BLOCK_SIZE):
            x = POOL_LEFT + slot * SLOT_W
            if (block, slot) in owned:
                name, token, colour = owned[(block, slot)]
                body.append(_slot_box(x, y, f"{name} t{token}", colour, True))
            else:
                body.append(_slot_box(x, y, "stale" if block in used else "free", STALE, False))
    # The block tables, one row a sequence, each entry joined to its block.
    for row, (name, (table, length, colour)) in enumerate(SEQUENCES.items()):
        top = 110 + row * 130
        body.append(text(20, top - 26, f"{name}: {length} tokens, table {table}",
                         anchor="start", size=12, bold=True))
        for logical, block in enumerate(table):
            x = 40 + logical * (SLOT_W + 30)
            body.append(_slot_box(x, top, str(block), colour, True))
            body.append(text(x + SLOT_W / 2, top - 5, f"logical {logical}", colour=MUTED, size=10))
            body.append(line(x + SLOT_W, top + SLOT_H / 2, POOL_LEFT - 60, _block_y(block) + SLOT_H / 2,
                             colour, width=1.5))
    # The free stack, read left to right, its top last.
    left = POOL_LEFT + 3 * SLOT_W
    body.append(text(left, 110, "free stack (top last):", anchor="start", size=12, bold=True))
    for index, block in enumerate(FREE_STACK):
        body.append(_slot_box(left + index * (SLOT_W + 4), 122, str(block), "#7f7f7f", True))
    body.append(text(left, 176, "allocate_blocks pops the top: block 6 next;", anchor="start", size=11,
                     colour=MUTED))
    body.append(text(left, 192, "a freed block is pushed on the top, and reused first.", anchor="start",
                     size=11, colour=MUTED))
    body.append(text(left, 236, "Token t of a sequence is in logical block t // 2,", anchor="start", size=11,
                     colour=TEXT))
    body.append(text(left, 252, "slot t % 2, of physical block table[t // 2].", anchor="start", size=11,
                     colour=TEXT))
    body.append(text(left, 276, "B's slot after its last token is stale:", anchor="start", size=11,
                     colour=TEXT))
    body.append(text(left, 292, "attention masks positions >= seq_len.", anchor="start", size=11,
                     colour=TEXT))
    return svg_document(width, height, body)


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/11_paged_kv_cache/figures/``."""
    return {"paged_kv_cache.svg": paged_kv_cache_svg()}
