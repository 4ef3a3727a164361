"""Where a decode step's float32 matmuls go on this CPU: torch's default `F.linear` (MKL's sgemm)
against oneDNN's `mkldnn._linear_pointwise` and MKL's packed-weight path, at SmolLM2-135M's shapes
(issue: fast generation).

A decode step at batch B multiplies a [B, 576] activation by every weight matrix once; at batch 16
these skinny matmuls, not the weight reads, set the step time (RESULTS.md, "Fast generation"). The
BLAS behind them differs by machine: on an AMD EPYC (AVX2) MKL's sgemm ran the 49k-vocabulary head
2x slower than oneDNN. This script prints microseconds per call, GFLOP/s and the ratio to the
default, for the shapes of one SmolLM2 layer and its head, and the CPU it ran on. Weights are
cold, as in a decode step, which reads all 540 MB of them once: each call takes the next of enough
copies of the weight to fill 256 MB, far beyond the caches (`--warm` reuses one copy instead).

    .venv/bin/python benchmarks/bench_linear.py [--batch 16 64] [--repeats 30]

Each path's output is checked against the default's (max abs difference printed): a faster path is
only usable for generation if it gives the same greedy tokens, which this does not test.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.nn.functional as F

# (name, in, out) of SmolLM2-135M's matmuls: 30 layers of q/o (576x576), k/v (576x192),
# gate/up (576x1536), down (1536x576), then the tied head over 49,152 tokens.
SHAPES = [("q_proj / o_proj", 576, 576), ("k_proj / v_proj", 576, 192), ("gate / up", 576, 1536),
          ("down", 1536, 576), ("lm_head", 576, 49152)]


def per_call_us(fn, repeats: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats * 1e6


def shape_rows(batch: int, d_in: int, d_out: int, copies: int, repeats: int):
    """(path, us per call, max abs diff to the default, speed against the default) for each path;
    every timed call takes the next of `copies` weight copies."""
    x = torch.randn(batch, d_in)
    ws = [torch.randn(d_out, d_in) / d_in**0.5 for _ in range(copies)]
    packs = [torch.ops.mkl._mkl_reorder_linear_weight(w, batch) for w in ws]
    paths = {"F.linear (default)": lambda i: F.linear(x, ws[i]),
             "oneDNN _linear_pointwise": lambda i: torch.ops.mkldnn._linear_pointwise(x, ws[i], None, "none", [], ""),
             "MKL packed weight": lambda i: torch.ops.mkl._mkl_linear(x, packs[i], ws[i], None, batch)}
    reference, base, turn = F.linear(x, ws[0]), None, iter(range(10**9))
    for label, fn in paths.items():
        us = per_call_us(lambda fn=fn: fn(next(turn) % copies), repeats)
        base = base or us
        yield label, us, (fn(0) - reference).abs().max().item(), base / us


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warm", action="store_true", help="one weight copy, reused (cache-warm)")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"{cpu_name()}; torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads, weights {'warm' if args.warm else 'cold'}\n")
    print("| matmul | batch | path | us per call | GFLOP/s | x default | max abs diff |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for batch in args.batch:
        for name, d_in, d_out in SHAPES:
            copies = 1 if args.warm else max(1, 256 * 2**20 // (4 * d_in * d_out))
            for label, us, diff, ratio in shape_rows(batch, d_in, d_out, copies, args.repeats):
                print(f"| {name} | {batch} | {label} | {us:.0f} | {2 * batch * d_in * d_out / us / 1e3:.1f} | "
                      f"{ratio:.2f} | {diff:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
