"""Known bugs of chapter 11: A paged KV cache.

Each is a one-line edit of the reference solution (``old`` to ``new``)
with the hint a student reads when their answer matches it; its lesson's
Pitfalls section names it in a ``<!-- known bugs: ... -->`` tag.
"""

from grader.chapters import KnownBug

BUGS = (
    # TODO: at least four known bugs of BlockAllocator, each a mistake students make.
    KnownBug("BlockAllocator", "todo-blockallocator-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
    # TODO: at least four known bugs of append_to_pages, each a mistake students make.
    KnownBug("append_to_pages", "todo-append-to-pages-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
    # TODO: at least four known bugs of paged_attention, each a mistake students make.
    KnownBug("paged_attention", "todo-paged-attention-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
)
