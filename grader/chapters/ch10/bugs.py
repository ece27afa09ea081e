"""Known bugs of chapter 10: Bounded-memory decoding: sliding windows, a rolling cache, attention sinks.

Each is a one-line edit of the reference solution (``old`` to ``new``)
with the hint a student reads when their answer matches it; its lesson's
Pitfalls section names it in a ``<!-- known bugs: ... -->`` tag.
"""

from grader.chapters import KnownBug

BUGS = (
    # TODO: at least four known bugs of sliding_window_mask, each a mistake students make.
    KnownBug("sliding_window_mask", "todo-sliding-window-mask-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
    # TODO: at least four known bugs of rolling_cache_append, each a mistake students make.
    KnownBug("rolling_cache_append", "todo-rolling-cache-append-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
    # TODO: at least four known bugs of streaming_attention_step, each a mistake students make.
    KnownBug("streaming_attention_step", "todo-streaming-attention-step-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
)
