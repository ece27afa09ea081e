"""Chapter 12: Multi-head latent attention.

TODO: what the chapter's exercises build, in a sentence or two. The lesson
is chapters/12_latent_attention/README.md.
"""

import torch


def MultiHeadLatentAttention(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION


def absorbed_decode(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION


def latent_cache_bytes(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION
