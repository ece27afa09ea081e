"""Known bugs of chapter 9: The backward pass of tiled attention.

Each is a one-line edit of the reference solution (``old`` to ``new``)
with the hint a student reads when their answer matches it; its lesson's
Pitfalls section names it in a ``<!-- known bugs: ... -->`` tag.
"""

from grader.chapters import KnownBug

BUGS = (
    # TODO: at least four known bugs of flash_attention_forward, each a mistake students make.
    KnownBug("flash_attention_forward", "todo-flash-attention-forward-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
    # TODO: at least four known bugs of flash_attention_backward, each a mistake students make.
    KnownBug("flash_attention_backward", "todo-flash-attention-backward-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
    # TODO: at least four known bugs of FlashAttentionFunction, each a mistake students make.
    KnownBug("FlashAttentionFunction", "todo-flashattentionfunction-doubled", "looks like TODO: the hint a student reads",
             "return x.clone()", "return 2 * x"),
)
