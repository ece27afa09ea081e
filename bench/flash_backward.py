"""Chapter 9's FlashAttentionFunction against PyTorch's attention, forward and backward.

Run by hand: ``python bench/flash_backward.py [--device cpu|cuda] [--length 2048] [--block 128] [--runs 5]``.
For ``q``, ``k``, ``v`` of shape ``(1, heads, T, 64)`` in float32, causal and
not, it times one training step of attention, forward then backward from a
random ``grad_out``, through three implementations:

* ``naive``: chapter 1's attention (the whole ``(T, T)`` scores, softmax),
  autograd's backward, which keeps the ``(T, T)`` weights;
* ``chapter 9``: the reference ``FlashAttentionFunction`` (blocks of keys in
  Python, the backward rebuilding each block's weights from ``lse``);
* ``sdpa``: ``F.scaled_dot_product_attention`` and its own backward (on CPU
  its flash kernel, on CUDA whichever backend it picks).

It prints the median wall time of each (the first run is a warm-up, not
counted), the ratio to ``sdpa``'s, and on CUDA the peak memory torch
allocated during the step. Not run by tests: its numbers depend on the
machine, and the lesson's table names the card each row was measured on.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch
import torch.nn.functional as F

from flash_attention import naive_attention  # chapter 1's attention, beside this file
from grader.catalog import find_chapter


def chapter9():
    """The reference's ``flash_attention(q, k, v, causal, block_size)``."""
    chapter = find_chapter("ch09")
    spec = importlib.util.spec_from_file_location("reference_ch09", chapter.solution())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.flash_attention


def step_seconds(attention, q, k, v, grad_out, device: str, runs: int) -> tuple[float, int]:
    """Median seconds of forward + backward, and the peak bytes torch allocated (CUDA; 0 on CPU)."""
    times, peak = [], 0
    for run in range(runs + 1):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        out = attention(*leaves)
        torch.autograd.grad(out, leaves, grad_out)
        if device == "cuda":
            torch.cuda.synchronize()
            peak = max(peak, torch.cuda.max_memory_allocated())
        if run:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("flash_backward: no CUDA device here")
        return
    card = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    flash = chapter9()
    generator = torch.Generator().manual_seed(0)
    shape = (1, args.heads, args.length, 64)
    q, k, v, grad_out = (torch.randn(*shape, generator=generator).to(args.device) for _ in range(4))
    print(f"forward + backward, (1, {args.heads}, {args.length}, 64) float32, blocks of {args.block}, {card}, "
          f"torch {torch.__version__}")
    print(f"{'causal':>6} {'implementation':>14} {'ms':>9} {'vs sdpa':>8} {'peak MiB':>9}")
    for causal in (False, True):
        implementations = {  # each run within this iteration: causal bound as a default all the same
            "naive": lambda q, k, v, causal=causal: naive_attention(q, k, v, causal),
            "chapter 9": lambda q, k, v, causal=causal: flash(q, k, v, causal, args.block),
            "sdpa": lambda q, k, v, causal=causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        }
        results = {name: step_seconds(attention, q, k, v, grad_out, args.device, args.runs)
                   for name, attention in implementations.items()}
        baseline = results["sdpa"][0]
        for name, (seconds, peak) in results.items():
            peak_text = f"{peak / 2**20:9.1f}" if args.device == "cuda" else f"{'-':>9}"
            print(f"{causal!s:>6} {name:>14} {seconds * 1e3:9.1f} {seconds / baseline:8.1f} {peak_text}")


if __name__ == "__main__":
    main()
