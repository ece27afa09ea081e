"""Naive attention, the reference tiled attention and PyTorch's, at T = 4096.

Run by hand: ``python bench/flash_attention.py [--length 4096] [--block 128] [--runs 3]``.
For one head (``q``, ``k``, ``v`` of shape ``(1, 1, T, 64)``, float32), causal
and not, it prints the median wall time of each implementation and the
largest tensor it makes. The largest tensor is measured as the grader
measures students' code (``grader.footprint.Measure``): every ATen
operation's output, views and in-place results left out. It is the memory
that grows with T, not the peak of the process; for
``F.scaled_dot_product_attention`` it shows what its CPU kernel allocates
itself (its inner blocks are not tensors and are not seen). On CUDA
(``--device cuda``) the peak memory torch allocated is printed as well.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import time

import torch
import torch.nn.functional as F

from grader.catalog import find_chapter
from grader.footprint import Measure


def naive_attention(q, k, v, causal: bool = False):
    """Chapter 1's attention: the whole (T, T) score matrix."""
    length, keys = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., L, S)
    if causal:
        mask = torch.ones(length, keys, dtype=torch.bool, device=q.device).tril(keys - length)
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def pytorch_attention(q, k, v, causal: bool = False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # L == S: both alignments agree


def reference_tiled():
    chapter = find_chapter("ch07")
    spec = importlib.util.spec_from_file_location("reference_ch07", chapter.solution())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tiled_attention


def measure(function, runs: int, device: str) -> tuple[float, tuple, int, int | None]:
    """Median seconds, the largest tensor's shape and bytes, CUDA's peak bytes (or None)."""
    function()  # warm up
    times = []
    for _ in range(runs):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        function()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    with Measure() as recorder:
        function()
    peak = None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        function()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    largest = recorder.largest or {"shape": [], "bytes": 0}
    return statistics.median(times), tuple(largest["shape"]), largest["bytes"], peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=4096, help="T, queries and keys")
    parser.add_argument("--width", type=int, default=64, help="d, the width of the head")
    parser.add_argument("--block", type=int, default=128, help="keys per block of the tiled version")
    parser.add_argument("--runs", type=int, default=3, help="timed runs; the median is printed")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    options = parser.parse_args()

    torch.manual_seed(0)
    shape = (1, 1, options.length, options.width)  # (B, H, T, d): F.sdpa's fused kernels want 4-D
    q, k, v = (torch.randn(shape, device=options.device) for _ in range(3))
    tiled = reference_tiled()
    print(f"T = {options.length}, d = {options.width}, float32, one head, {options.device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {options.runs}")
    print(f"{'':40} {'time':>11}  {'largest tensor':>20} {'MiB':>8}" + ("  peak MiB" if options.device == "cuda" else ""))
    for causal in (False, True):
        expected = pytorch_attention(q, k, v, causal)
        for name, function in [
            ("naive (whole T x T)", lambda: naive_attention(q, k, v, causal)),
            (f"tiled, blocks of {options.block}", lambda: tiled(q, k, v, options.block, causal=causal)[0]),
            ("F.scaled_dot_product_attention", lambda: pytorch_attention(q, k, v, causal)),
        ]:
            error = float((function() - expected).abs().max())
            seconds, largest, size, peak = measure(function, options.runs, options.device)
            label = f"{name}{', causal' if causal else ''}"
            line = f"{label:<40.40} {seconds * 1000:8.1f} ms  {str(largest):>20} {size / 2**20:8.2f}"
            if peak is not None:
                line += f"  {peak / 2**20:9.1f}"
            print(line + f"  (max diff {error:.1e})")


if __name__ == "__main__":
    main()
