"""Draws the figures of chapter 5: ``figures()`` returns each SVG by its name in ``figures/``.

Everything is computed here from hand-picked numbers (no randomness, and no
import of the reference solution, which students do not receive):

* ``rotation.svg``: one pair of features turned by RoPE at positions 0 to 5,
  for the fastest pair (1 radian per position) and the next one of d = 8
  (0.1 radian per position);
* ``frequencies.svg``: the frequency theta^(-2k/d) of every pair k of a
  64-wide head, on a log scale, for theta = 10000 and 500000;
* ``pairings.svg``: which features form a pair in the adjacent convention
  (RoPE paper, Meta, CS336) and in the rotate-half one (GPT-NeoX, Hugging Face);
* ``relative_scores.svg``: the score q_m . k_n of one query and one key
  rotated to every pair of positions: constant along each diagonal, because
  it depends only on m - n.
"""

import math

import torch

from grader.figures import CELL, LABEL, MUTED, line, svg_document, text, vertical_text

# One colour a pair of features (k = 0 .. 3), used by every figure.
PAIR_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")


def _arrow(x0: float, y0: float, x1: float, y1: float, colour: str, width: float = 2.0) -> str:
    """A line from (x0, y0) to (x1, y1) with a small filled head at the end."""
    angle = math.atan2(y1 - y0, x1 - x0)
    head = 9
    left = (x1 - head * math.cos(angle - 0.4), y1 - head * math.sin(angle - 0.4))
    right = (x1 - head * math.cos(angle + 0.4), y1 - head * math.sin(angle + 0.4))
    return (line(x0, y0, x1, y1, colour, width)
            + f"<path d='M{x1:.1f} {y1:.1f}L{left[0]:.1f} {left[1]:.1f}L{right[0]:.1f} {right[1]:.1f}Z' "
              f"fill='{colour}'/>")


# -- rotation.svg -------------------------------------------------------------------------


def _rotation_panel(centre_x: float, centre_y: float, radius: float, frequency: float,
                    title: str, colour: str) -> list[str]:
    parts = [
        text(centre_x, centre_y - radius - 34, title, bold=True),
        f"<circle cx='{centre_x}' cy='{centre_y}' r='{radius}' fill='none' stroke='#ccc' "
        "stroke-dasharray='4 3'/>",
        f"<line x1='{centre_x - radius - 12}' y1='{centre_y}' x2='{centre_x + radius + 12}' "
        f"y2='{centre_y}' stroke='#ddd'/>",
        f"<line x1='{centre_x}' y1='{centre_y - radius - 12}' x2='{centre_x}' "
        f"y2='{centre_y + radius + 12}' stroke='#ddd'/>",
        text(centre_x + radius + 8, centre_y + 20, "x[2k]", anchor="start", colour=MUTED),
        text(centre_x, centre_y - radius - 16, "x[2k+1]", colour=MUTED),
    ]
    for position in range(6):
        angle = position * frequency  # radians; SVG's y axis points down, hence the minus below
        tip_x = centre_x + radius * math.cos(angle)
        tip_y = centre_y - radius * math.sin(angle)
        shade = 0.35 + 0.65 * position / 5  # later positions darker
        parts.append(f"<g opacity='{shade:.2f}'>{_arrow(centre_x, centre_y, tip_x, tip_y, colour)}</g>")
        label_x = centre_x + (radius + 14) * math.cos(angle)
        label_y = centre_y - (radius + 14) * math.sin(angle) + 4
        if frequency < 0.5:  # the arrows of a slow pair bunch together: stack their labels instead
            label_x, label_y = centre_x + radius + 16, centre_y - 12 - 13 * position
        parts.append(text(label_x, label_y, f"m={position}", size=11,
                          anchor="start" if frequency < 0.5 else "middle"))
    parts.append(text(centre_x, centre_y + radius + 34,
                      f"angle = m × {frequency:g} rad", colour=MUTED))
    return parts


def rotation_svg() -> str:
    width, height = 760, 380
    body = [text(width / 2, 22, "RoPE turns each pair of features by an angle that grows with the "
                 "position m", size=14, bold=True)]
    body += _rotation_panel(190, 200, 110, 1.0, "pair k = 0: 1 radian per position", PAIR_COLOURS[0])
    body += _rotation_panel(560, 200, 110, 0.1, "pair k = 1 of d = 8: 0.1 radian per position",
                            PAIR_COLOURS[1])
    return svg_document(width, height, body)


# -- frequencies.svg ------------------------------------------------------------------------


def frequencies_svg() -> str:
    head_dim = 64
    pairs = head_dim // 2
    left, top, plot_w, plot_h = 80, 60, 560, 300
    lowest = -6  # log10 of the bottom of the axis
    width, height = left + plot_w + 40, top + plot_h + 90

    def x_of(k: float) -> float:
        return left + plot_w * k / (pairs - 1)

    def y_of(value: float) -> float:
        return top + plot_h * (-math.log10(value)) / -lowest

    body = [
        text(width / 2, 24, f"Frequency of each pair k: theta^(-2k/d), d = {head_dim}", size=14, bold=True),
        f"<rect x='{left}' y='{top}' width='{plot_w}' height='{plot_h}' fill='none' stroke='#bbb'/>",
    ]
    for exponent in range(0, lowest - 1, -1):
        y = y_of(10.0 ** exponent)
        body.append(f"<line x1='{left}' y1='{y:.1f}' x2='{left + plot_w}' y2='{y:.1f}' stroke='#eee'/>")
        body.append(text(left - 8, y + 4, "1" if exponent == 0 else f"1e{exponent}", anchor="end"))
    for k in range(0, pairs, 4):
        body.append(text(x_of(k), top + plot_h + 18, str(k)))
    body.append(text(left + plot_w / 2, top + plot_h + 40, "pair k (features 2k and 2k+1)", colour=MUTED))
    body.append(vertical_text(22, top + plot_h / 2, "radians per position (log scale)"))
    for theta, colour in ((10000.0, PAIR_COLOURS[0]), (500000.0, PAIR_COLOURS[1])):
        for k in range(pairs):
            frequency = theta ** (-2 * k / head_dim)
            body.append(f"<circle cx='{x_of(k):.1f}' cy='{y_of(frequency):.1f}' r='4' fill='{colour}'/>")
    legend_y = top + plot_h + 66
    body.append(f"<circle cx='{left + 10}' cy='{legend_y - 4}' r='5' fill='{PAIR_COLOURS[0]}'/>")
    body.append(text(left + 22, legend_y, "theta = 10000 (RoPE paper, LLaMA 1 and 2): from 1 down to "
                     "1.3e-4", anchor="start"))
    body.append(f"<circle cx='{left + 10}' cy='{legend_y + 14}' r='5' fill='{PAIR_COLOURS[1]}'/>")
    body.append(text(left + 22, legend_y + 18, "theta = 500000 (LLaMA 3): slower pairs for longer "
                     "contexts", anchor="start"))
    return svg_document(width, height, body)


# -- pairings.svg ---------------------------------------------------------------------------


def _pairing_row(y: float, partner_of: list[int], pair_of: list[int], title: str) -> list[str]:
    box, gap, left = 46, 10, 150
    parts = [text(20, y + box / 2 + 4, title, anchor="start", bold=True)]
    centres = [left + i * (box + gap) + box / 2 for i in range(len(pair_of))]
    for i, centre in enumerate(centres):
        colour = PAIR_COLOURS[pair_of[i]]
        parts.append(f"<rect x='{centre - box / 2}' y='{y}' width='{box}' height='{box}' rx='4' "
                     f"fill='{colour}' fill-opacity='0.18' stroke='{colour}' stroke-width='2'/>")
        parts.append(text(centre, y + box / 2 + 5, f"x[{i}]", size=13))
        parts.append(text(centre, y + box + 16, f"k={pair_of[i]}", size=11, colour=colour))
        partner = partner_of[i]
        if partner > i:  # one arc a pair, drawn above the boxes
            start, end = centre, centres[partner]
            rise = 14 + 9 * (partner - i)
            parts.append(f"<path d='M{start} {y}C{start} {y - rise} {end} {y - rise} {end} {y}' "
                         f"fill='none' stroke='{colour}' stroke-width='2'/>")
    return parts


def pairings_svg() -> str:
    head_dim = 8
    half = head_dim // 2
    adjacent_partner = [i + 1 if i % 2 == 0 else i - 1 for i in range(head_dim)]
    half_partner = [i + half if i < half else i - half for i in range(head_dim)]
    width, height = 640, 270
    body = [text(width / 2, 22, "Which features turn together (d = 8, colour = pair k, same angle)",
                 size=14, bold=True)]
    body += _pairing_row(70, adjacent_partner, [i // 2 for i in range(head_dim)], "apply_rope")
    body.append(text(20, 146, "adjacent: (x[2k], x[2k+1])", anchor="start", size=11, colour=MUTED))
    body += _pairing_row(190, half_partner, [i % half for i in range(head_dim)], "apply_rope_half")
    body.append(text(20, 266, "rotate-half: (x[k], x[k + d/2])", anchor="start", size=11, colour=MUTED))
    return svg_document(width, height, body)


# -- relative_scores.svg -------------------------------------------------------------------

QUERY = torch.tensor([1.0, 0.5, -0.5, 1.0, 1.0, 0.0, 0.5, 0.5])  # d = 8, hand-picked
KEY = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.5, 0.5, 1.0, 0.0])


def _rotate(vector: torch.Tensor, position: int, theta: float = 10000.0) -> torch.Tensor:
    """Adjacent pairs of ``vector`` (d,) turned by position * theta^(-2k/d)."""
    head_dim = vector.shape[-1]
    angles = position * theta ** (-2 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
    even, odd = vector.double()[0::2], vector.double()[1::2]
    turned = torch.stack([even * angles.cos() - odd * angles.sin(),
                          even * angles.sin() + odd * angles.cos()], dim=-1)
    return turned.flatten()


def _diverging(value: float, largest: float) -> str:
    """Red for positive, blue for negative, white for 0."""
    share = min(abs(value) / largest, 1.0)
    end = (178, 24, 43) if value > 0 else (33, 102, 172)
    red, green, blue = (round(255 + (e - 255) * share) for e in end)
    return f"#{red:02x}{green:02x}{blue:02x}"


def relative_scores_svg() -> str:
    positions = range(8)
    scores = [[float(_rotate(QUERY, m) @ _rotate(KEY, n)) for n in positions] for m in positions]
    largest = max(abs(value) for row in scores for value in row)
    top = LABEL + 28
    width = max(LABEL + len(positions) * CELL + 40, 500)  # the title needs room
    height = top + len(positions) * CELL + 50
    body = [
        text(width / 2, 18, "Score q_m · k_n of one query and one key at every position",
             size=14, bold=True),
        text(LABEL + len(positions) * CELL / 2, 40, "key position n", colour=MUTED),
        vertical_text(14, top + len(positions) * CELL / 2, "query position m"),
    ]
    for n in positions:
        body.append(text(LABEL + n * CELL + CELL / 2, top - 8, str(n)))
    for m in positions:
        body.append(text(LABEL - 10, top + m * CELL + CELL / 2 + 4, str(m), anchor="end"))
        for n in positions:
            value = scores[m][n]
            x, y = LABEL + n * CELL, top + m * CELL
            ink = "white" if abs(value) > 0.6 * largest else "black"
            body.append(f"<rect x='{x}' y='{y}' width='{CELL}' height='{CELL}' "
                        f"fill='{_diverging(value, largest)}' stroke='white'/>")
            shown = f"{value:.2f}".replace("-0.00", "0.00")
            body.append(text(x + CELL / 2, y + CELL / 2 + 4, shown, colour=ink))
    body.append(text(LABEL, height - 14, "every diagonal (same m - n) holds one number", anchor="start",
                     colour=MUTED))
    return svg_document(width, height, body)


def figures() -> dict[str, str]:
    """``{file name: SVG text}`` for ``chapters/05_rope/figures/``."""
    return {
        "rotation.svg": rotation_svg(),
        "frequencies.svg": frequencies_svg(),
        "pairings.svg": pairings_svg(),
        "relative_scores.svg": relative_scores_svg(),
    }
