"""Chapter 11: A paged KV cache.

TODO: what the chapter's exercises build, in a sentence or two. The lesson
is chapters/11_paged_kv_cache/README.md.
"""

import torch


def BlockAllocator(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION


def append_to_pages(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION


def paged_attention(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION
