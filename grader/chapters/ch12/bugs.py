"""Known bugs of chapter 12: Multi-head latent attention.

Each is a one-line edit of the reference solution (``old`` to ``new``)
with the hint a student reads when their answer matches it; its lesson's
Pitfalls section names it in a ``<!-- known bugs: ... -->`` tag.
"""

from grader.chapters import KnownBug

BUGS = (
    # TODO: at least four known bugs of MultiHeadLatentAttention, each a mistake students make.
    KnownBug("MultiHeadLatentAttention", "todo-multiheadlatentattention-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
    # TODO: at least four known bugs of absorbed_decode, each a mistake students make.
    KnownBug("absorbed_decode", "todo-absorbed-decode-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
    # TODO: at least four known bugs of latent_cache_bytes, each a mistake students make.
    KnownBug("latent_cache_bytes", "todo-latent-cache-bytes-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
)
