"""Name a mistake nobody catalogued, from how the wrong answer relates to the right one.

(Skeleton: the relations follow.)
"""

from __future__ import annotations

ENABLED = True  # off only to measure what relations change (bench/hints.py)

NAMES = ("factor", "transposed", "rearranged", "shifted", "edge", "future", "past", "diagonal", "inverted",
         "masked", "normalized_over", "scale", "log", "narrowed", "nan_rows", "roles")


def explain(got, expected, axes=None, rtol=None, atol=None):
    """``(names, hint)`` of the relations that explain ``got``; None where none does."""
    return None
