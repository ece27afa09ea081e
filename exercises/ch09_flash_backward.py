"""Chapter 9: the backward pass of tiled attention.

Fill in the body of each function and method (the lines that raise
NotImplementedError). Read chapters/09_flash_backward/README.md first; grade
your work with

    mha-course grade ch09

Chapter 7 computed attention's output block by block; this chapter trains
through it. Its forward keeps, besides the output, one number a query, the
log-sum-exp of its scores, and its backward pass rebuilds each block of
attention weights from that number instead of storing the (L, S) weights,
as FlashAttention does (Dao 2022; Dao 2023, FlashAttention-2).

Conventions used in every exercise of this chapter:

* Queries ``q`` have shape ``(..., L, d)``, keys ``k`` ``(..., S, d)`` and
  values ``v`` ``(..., S, d_v)``; the leading dimensions are batch (and
  head) dimensions, the same for all three. The scale is ``1 / sqrt(d)``.
* Keys are processed in blocks of ``block_size`` consecutive keys: keys
  ``0 .. block_size - 1``, then the next ``block_size``, and so on; the last
  block is shorter when ``block_size`` does not divide ``S``.
* Causal is chapter 4's bottom-right alignment: query ``i`` sits at position
  ``i + S - L`` and sees keys ``0 .. i + S - L``. A query with no key to see
  (``L > S``) gets a zero output, log-sum-exp ``-inf`` and zero gradients.
* Memory is the point: no function builds a tensor of ``L x S`` numbers
  (scores, weights, their gradients, a mask), only ``(L, block_size)``
  pieces; what the forward pass keeps for the backward pass is ``q``, ``k``,
  ``v``, the output and the log-sum-exp, nothing of size ``L x S``. The
  grader measures the memory your code maps, as the kernel counts it.
* Precision, the course's rule: a function returns floating results in the
  dtype of its floating inputs. float32 and float64 inputs get float32's
  accuracy: inside, a function may compute in float32 or wider, and the
  checks compare float64 results at float32's tolerance.
* Devices: inputs come on the CPU or on a GPU; make any new tensor (running
  max, sums, gradients, positions) on the inputs' device
  (``device=q.device``) and return results there.

You may not call ``torch.softmax`` (or its relatives) nor
``F.scaled_dot_product_attention``: this chapter is how their gradients can
be computed.
"""

import math

import torch


def flash_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over blocks of keys with an online softmax, and each query's log-sum-exp.

    Chapter 7's ``tiled_attention`` again (written here anew): for each block
    of keys, its scores ``(..., L, block)``, the new running max ``m`` and sum
    ``l`` of every query, and the running output ``acc``, rescaled by
    ``exp(m_old - m_new)`` whenever the max grows. At the end ``acc / l``, and
    ``lse = m + log l``, which the backward pass needs.

    Dtypes: ``q``, ``k``, ``v`` float32 or float64, one dtype; both results
    have ``q``'s dtype.

    Args:
        q: queries, shape ``(..., L, d)``.
        k: keys, shape ``(..., S, d)``.
        v: values, shape ``(..., S, d_v)``.
        causal: when True, query ``i`` sees keys ``0 .. i + S - L`` only
            (bottom-right); ``L`` may exceed ``S``.
        block_size: keys per block, ``>= 1`` (``>= S`` is one block).

    Returns:
        ``(out, lse)``, without ever making a tensor of ``L x S`` numbers:

        * ``out``, shape ``(..., L, d_v)``: ``softmax(q k^T / sqrt(d)) v``;
          zeros for a query that sees no key.
        * ``lse``, shape ``(..., L)``: the log of the sum of ``exp(score)``
          over the keys a query sees; ``-inf`` for a query that sees none.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def flash_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    causal: bool = False,
    block_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of attention with respect to q, k and v, one block of keys at a time.

    With scores ``s = q k^T / sqrt(d)``, weights ``P = softmax(s)`` and
    ``out = P v``, for a loss whose gradient with respect to ``out`` is
    ``grad_out`` (``dO``):

    * ``dV = P^T dO`` and ``dP = dO V^T``;
    * ``dS = P * (dP - D)``, where ``D = rowsum(dO * O)`` (one number a
      query, equal to ``rowsum(P * dP)``);
    * ``dQ = dS K / sqrt(d)`` and ``dK = dS^T Q / sqrt(d)``.

    ``P`` is never stored: for each block of keys, its weights are rebuilt
    from the scores and ``lse`` as ``exp(s - lse)``. Each key block's ``dK``
    and ``dV`` come whole from that block; ``dQ`` sums over the blocks.

    Dtypes: every tensor float32 or float64, one dtype; the gradients have
    ``q``'s dtype.

    Args:
        q: queries, shape ``(..., L, d)``.
        k: keys, shape ``(..., S, d)``.
        v: values, shape ``(..., S, d_v)``.
        out: the attention output, shape ``(..., L, d_v)`` (what
            ``flash_attention_forward`` returns).
        lse: each query's log-sum-exp of its scores, shape ``(..., L)``;
            ``-inf`` for a query that sees no key.
        grad_out: the gradient of the loss with respect to ``out``, shape
            ``(..., L, d_v)``.
        causal: the mask the forward pass used (bottom-right).
        block_size: keys per block, ``>= 1``.

    Returns:
        ``(dq, dk, dv)`` of the shapes of ``q``, ``k`` and ``v``; zero rows
        of ``dq`` for queries that see no key. No tensor of ``L x S``
        numbers is made.
    """
    # YOUR CODE HERE
    raise NotImplementedError


class FlashAttentionFunction(torch.autograd.Function):
    """Attention as one autograd node: forward tiled, backward recomputed block by block.

    ``FlashAttentionFunction.apply(q, k, v, causal, block_size)`` returns
    attention's output; autograd then calls ``backward`` with the gradient of
    the loss with respect to that output. Use your two functions above.
    ``flash_attention``, ``flash_attention_gradients`` and
    ``saved_for_backward``, below the class, are given: how a model (and
    the grader) calls it, one training step through it, and what the
    grader reads of what it saves. The grader backpropagates through
    ``flash_attention``'s output with its own autograd call: the points
    come from your class, whatever the given functions are made to do.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                block_size: int = 64) -> torch.Tensor:
        """The attention output, ``(..., L, d_v)``, from ``flash_attention_forward``.

        Saves for backward exactly ``q``, ``k``, ``v``, the output and the
        log-sum-exp, with ``ctx.save_for_backward`` (nothing of size
        ``L x S``), and keeps ``causal`` and ``block_size`` on ``ctx``.

        Args:
            ctx: the node's context, where forward leaves what backward needs.
            q, k, v: ``(..., L, d)``, ``(..., S, d)``, ``(..., S, d_v)``,
                float32 or float64, one dtype.
            causal: bottom-right causal mask, as in the functions above.
            block_size: keys per block, ``>= 1``.
        """
        # YOUR CODE HERE
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        """One gradient for each argument of forward, from ``flash_attention_backward``.

        Args:
            ctx: the context forward filled.
            grad_out: the gradient of the loss with respect to the output,
                ``(..., L, d_v)``.

        Returns:
            ``(dq, dk, dv, None, None)``: the gradients of ``q``, ``k`` and
            ``v``, and None for ``causal`` and ``block_size``, which have none.
        """
        # YOUR CODE HERE
        raise NotImplementedError


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    block_size: int = 64) -> torch.Tensor:
    """Attention through ``FlashAttentionFunction``, as a model calls it (given).

    Args:
        q, k, v: ``(..., L, d)``, ``(..., S, d)``, ``(..., S, d_v)``.
        causal: bottom-right causal mask.
        block_size: keys per block.

    Returns:
        ``(..., L, d_v)``, an output autograd can differentiate.
    """
    return FlashAttentionFunction.apply(q, k, v, causal, block_size)


def flash_attention_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
                              causal: bool = False, block_size: int = 64):
    """One training step's attention (given): ``flash_attention`` forward, then backward from ``grad_out``.

    ``FlashAttentionFunction.forward`` runs, then autograd runs its
    ``backward`` for the loss ``sum(out * grad_out)``, whose gradient with
    respect to ``out`` is ``grad_out``. The grader calls it, and also calls
    ``flash_attention`` and backpropagates ``grad_out`` through its output
    itself, in the same way.

    Args:
        q, k, v: ``(..., L, d)``, ``(..., S, d)``, ``(..., S, d_v)``.
        grad_out: ``(..., L, d_v)``.
        causal: bottom-right causal mask.
        block_size: keys per block.

    Returns:
        ``(out, dq, dk, dv)``; a gradient autograd did not reach is None.
    """
    q, k, v = (tensor.detach().requires_grad_(True) for tensor in (q, k, v))
    out = flash_attention(q, k, v, causal, block_size)
    grads = torch.autograd.grad((out * grad_out).sum(), (q, k, v), allow_unused=True)
    return (out.detach(), *grads)


def saved_for_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                       block_size: int = 64) -> list[tuple[int, ...]]:
    """The shapes of the tensors ``flash_attention`` keeps for backward (given).

    Autograd's ``saved_tensors_hooks`` see each tensor saved while the
    forward pass runs: those given to ``ctx.save_for_backward`` (the
    operations inside ``forward`` run with gradient tracking off and save
    nothing). The grader's note on what your class saves reads them.

    Args:
        q, k, v: ``(..., L, d)``, ``(..., S, d)``, ``(..., S, d_v)``.
        causal: bottom-right causal mask.
        block_size: keys per block.

    Returns:
        One shape a saved tensor, in the order they were saved.
    """
    shapes = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(tensor.shape))
        return tensor

    q, k, v = (tensor.detach().requires_grad_(True) for tensor in (q, k, v))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        flash_attention(q, k, v, causal, block_size)
    return shapes
