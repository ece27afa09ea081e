"""Chapter 9: The backward pass of tiled attention.

TODO: what the chapter's exercises build, in a sentence or two. The lesson
is chapters/09_flash_backward/README.md.
"""

import torch


def flash_attention_forward(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION


def flash_attention_backward(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION


def FlashAttentionFunction(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION
