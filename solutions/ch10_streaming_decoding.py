"""Chapter 10: Bounded-memory decoding: sliding windows, a rolling cache, attention sinks.

TODO: what the chapter's exercises build, in a sentence or two. The lesson
is chapters/10_streaming_decoding/README.md.
"""

import torch


def sliding_window_mask(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION


def rolling_cache_append(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION


def streaming_attention_step(x: torch.Tensor) -> torch.Tensor:
    """TODO: what it computes, in the sentence a student reads first.

    Args:
        x: ``(..., d)``, float. TODO: every argument, its shape and dtype.

    Returns:
        ``(..., d)``: TODO.
    """
    # BEGIN SOLUTION
    return x.clone()  # TODO: the reference's code; the student writes what these markers hold
    # END SOLUTION
