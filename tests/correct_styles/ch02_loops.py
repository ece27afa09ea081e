"""Chapter 2 written with explicit Python loops over the batch.

The student who handles one sequence at a time: the padding mask is filled
row by row, the masks are combined sequence by sequence into a preallocated
result, and cross-attention runs each sequence on its real context tokens
only (slicing ``context[b, :n]``), writing into zero-filled outputs. An empty
context needs no special case: attention over no keys is an empty softmax
and a zero output.
"""

import math

import torch

MASK_CONVENTIONS = ("attend", "block", "additive")


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    if max_len is None:
        max_len = 0
        for n in lengths.tolist():
            max_len = max(max_len, n)
    mask = torch.zeros(len(lengths), max_len, dtype=torch.bool, device=lengths.device)
    for b, n in enumerate(lengths.tolist()):
        mask[b, :n] = True
    return mask


def convert_mask(mask, source, target, dtype=torch.float32):
    for name in (source, target):
        if name not in MASK_CONVENTIONS:
            raise ValueError(f"{name!r} is not a mask convention; expected one of {MASK_CONVENTIONS}")

    if source == "attend":
        allowed = mask.clone()
    elif source == "block":
        allowed = mask == False  # noqa: E712  (elementwise, not identity)
    else:
        allowed = mask != float("-inf")

    if target == "attend":
        return allowed
    if target == "block":
        return allowed == False  # noqa: E712
    result = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    result[~allowed] = float("-inf")
    return result


def combine_masks(key_padding, attn_mask=None):
    batch, keys = key_padding.shape
    queries = 1 if attn_mask is None else attn_mask.shape[-2]
    combined = torch.zeros(batch, 1, queries, keys, dtype=torch.bool, device=key_padding.device)
    for b in range(batch):
        allowed = key_padding[b][None, :]  # (1, S): the same for every query
        if attn_mask is not None:
            allowed = allowed & (attn_mask if attn_mask.dim() == 2 else attn_mask[b])  # (L, S)
        combined[b, 0] = allowed
    return combined  # (B, 1, L or 1, S)


def cross_attention(x, context, w_q, w_k, w_v, context_lengths=None):
    batch, queries, _ = x.shape
    keys = context.shape[1]
    output = torch.zeros(batch, queries, w_v.shape[0], dtype=x.dtype, device=x.device)
    weights = torch.zeros(batch, queries, keys, dtype=x.dtype, device=x.device)
    for b in range(batch):
        n = keys if context_lengths is None else int(context_lengths[b])
        q = x[b] @ w_q.T  # (L, d_k)
        k = context[b, :n] @ w_k.T  # (n, d_k): the real tokens only
        v = context[b, :n] @ w_v.T  # (n, d_v)
        scores = q @ k.T / math.sqrt(q.shape[-1])  # (L, n)
        # n == 0: an (L, 0) softmax is empty and (L, 0) @ (0, d_v) is zeros
        w = torch.softmax(scores, dim=-1)
        weights[b, :, :n] = w
        output[b] = w @ v
    return output, weights
