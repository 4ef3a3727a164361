"""The LM head of GRPO's log-probabilities on a CPU: TRL's fused head (`trl.kernels.chunked_logprob`,
whose tiles are folded by torch ops where Triton is absent) against `stages.dense_logps.DenseLogProbs`
on the same inputs (issue: fast generation, the GRPO step).

SmolLM2's head shape by default (576 wide, 49,152 tokens), `--positions` scored positions (a demo GRPO
step scores about 900 completion tokens in the policy's forward and backward and again in the
reference's forward), log p and entropy at temperature 1. Prints seconds for the forward alone and
for the forward and backward of a loss on the log-probabilities, best of `--repeats`, the ratio of the
dense head to TRL's, and the largest differences between the two heads' outputs and gradients.

    .venv/bin/python benchmarks/bench_lm_head.py [--positions 1000] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: allocations, thread pool
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> int:
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    from stages.dense_logps import DenseLogProbs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.positions, args.hidden, generator=g).requires_grad_()
    weight = (torch.randn(args.vocab, args.hidden, generator=g) * 0.05).requires_grad_()
    labels = torch.randint(0, args.vocab, (args.positions,), generator=g)
    heads = {
        "TRL fused head (baseline)": lambda: ChunkedLogProbFunction.apply(
            hidden, weight, None, labels, 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, ("log_probs", "entropy"))[:2],
        "dense head (stages.dense_logps)": lambda: DenseLogProbs.apply(hidden, weight, labels, 1.0)[:2],
    }

    def forward_only(head):
        with torch.no_grad():
            head()

    def forward_backward(head):
        hidden.grad = weight.grad = None
        logps, _ = head()
        logps.sum().backward()

    rows, outputs, base = [], {}, None
    for label, head in heads.items():
        fwd = best_seconds(lambda head=head: forward_only(head), args.repeats)
        both = best_seconds(lambda head=head: forward_backward(head), args.repeats)
        forward_backward(head)
        logps, entropy = head()
        outputs[label] = [logps.detach(), entropy.detach(), hidden.grad.clone(), weight.grad.clone()]
        base = base or (fwd, both)
        rows.append(f"| {label} | {fwd:.3f} | {both:.3f} | {fwd / base[0]:.2f} | {both / base[1]:.2f} |")
    print(f"{args.positions} positions x {args.hidden} wide x {args.vocab} tokens, {args.threads} threads, "
          f"best of {args.repeats}")
    print("| LM head | forward s | forward + backward s | forward vs TRL | forward + backward vs TRL |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    trl, dense = outputs.values()
    names = ("log p", "entropy", "grad hidden", "grad weight")
    print("largest difference, relative to the largest value: " + ", ".join(
        f"{n} {float((a - b).abs().max() / a.abs().max()):.1e}" for n, a, b in zip(names, trl, dense)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
