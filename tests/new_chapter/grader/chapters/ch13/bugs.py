"""Known bugs of chapter 13: sliding-window attention."""

from grader.chapters import KnownBug

BUGS = (
    KnownBug("sliding_window_mask", "window-one-too-wide",
             "looks like each query sees window + 1 keys: itself and the window - 1 before it make window",
             "(offset < window)", "(offset <= window)"),
    KnownBug("sliding_window_mask", "sees-the-future",
             "looks like the window reaches forward too: a query may attend only to itself and earlier keys",
             "(offset >= 0) & (offset < window)", "(offset.abs() < window)"),
    KnownBug("sliding_window_mask", "misses-itself",
             "looks like a query does not see its own key: the window includes the query's position",
             "(offset >= 0)", "(offset > 0)"),
    KnownBug("sliding_window_mask", "transposed",
             "looks like the mask is transposed: rows are queries, columns keys, and a query sees earlier keys",
             "positions[:, None] - positions[None, :]", "positions[None, :] - positions[:, None]"),
    KnownBug("sliding_window_mask", "mask-inverted",
             "looks like the mask is inverted: in this course True means the query may attend to the key",
             "return (offset >= 0) & (offset < window)", "return (offset < 0) | (offset >= window)"),
)
