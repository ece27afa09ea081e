"""Chapter 7 with torch.einsum for every product and float64 inside.

A careful student's version: inputs are promoted with .double() so that the
running statistics lose nothing, every contraction is spelled out with einsum
index letters, the running state is updated in place (mul_, add_, copy_), and
the result is cast back to the dtype that came in with .to(dtype).
"""

import math

import torch


def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    xd = x.double()
    mx = xd.new_full(xd.shape[:-1], -math.inf)  # (...,)
    denom = xd.new_zeros(xd.shape[:-1])  # (...,)
    n = xd.shape[-1]
    start = 0
    while start < n:
        piece = xd[..., start:start + block_size]  # (..., b)
        grown = torch.maximum(mx, piece.amax(-1))
        denom.mul_(torch.exp(mx - grown)).add_(torch.exp(piece - grown[..., None]).sum(-1))
        mx.copy_(grown)
        start += block_size
    return (torch.exp(xd - mx[..., None]) / denom[..., None]).to(x.dtype)


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int,
                    causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    qd, kd, vd = q.double(), k.double(), v.double()
    nq, nk, dk = qd.shape[-2], kd.shape[-2], qd.shape[-1]
    scale = 1.0 / math.sqrt(dk)
    mx = qd.new_full(qd.shape[:-1], -math.inf)  # (..., L)
    denom = qd.new_zeros(qd.shape[:-1])  # (..., L)
    num = qd.new_zeros(*qd.shape[:-1], vd.shape[-1])  # (..., L, d_v)
    qpos = torch.arange(nq, device=q.device) + (nk - nq)  # (L,) each query's position among the keys
    for b0 in range(0, nk, block_size):
        b1 = min(nk, b0 + block_size)
        s = torch.einsum("...id,...jd->...ij", qd, kd[..., b0:b1, :]) * scale  # (..., L, b)
        if causal:
            kpos = torch.arange(b0, b1, device=q.device)  # (b,)
            future = kpos[None, :] > qpos[:, None]  # (L, b)
            s = s.masked_fill(future, -math.inf)
        grown = torch.maximum(mx, s.amax(-1))  # (..., L)
        base = torch.where(torch.isneginf(grown), torch.zeros_like(grown), grown)
        w = torch.exp(s - base[..., None])  # (..., L, b)
        fix = torch.exp(mx - base)  # (..., L)
        denom.mul_(fix).add_(w.sum(-1))
        num.mul_(fix[..., None]).add_(torch.einsum("...ij,...jc->...ic", w, vd[..., b0:b1, :]))
        mx.copy_(grown)
    lse = mx + torch.log(denom)  # (..., L): log 0 = -inf where no key was visible
    denom = torch.where(denom == 0, torch.ones_like(denom), denom)  # no visible key: output 0
    return torch.einsum("...ic,...i->...ic", num, 1.0 / denom).to(q.dtype), lse.to(q.dtype)


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                    lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = lse_a.double(), lse_b.double()
    lse = torch.logaddexp(a, b)  # (..., L)
    out = (torch.einsum("...l,...lc->...lc", torch.exp(a - lse), out_a.double())
           + torch.einsum("...l,...lc->...lc", torch.exp(b - lse), out_b.double()))
    return out.to(out_a.dtype), lse.to(lse_a.dtype)
