"""accuracy_math throughput: pooled (worker processes, hard timeouts) vs a plain sequential loop,
plus adversarial answers that must each come back within timeout + 1 s, score 0, and leave no process.

    .venv/bin/python benchmarks/bench_math_verify.py [--n 10000] [--workers 2] [--timeout 5]
"""

from __future__ import annotations

import argparse
import os
import random
import time


def completions(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    from data_curation.sources import load_rows

    rng = random.Random(seed)
    rows = load_rows("synthetic_math", "train", 2000, seed=seed)
    comps, golds = [], []
    forms = [lambda a: f"\\boxed{{{a}}}", lambda a: f"\\boxed{{{a}.0}}", lambda a: f"\\boxed{{\\frac{{{2 * int(a)}}}{{2}}}}",
             lambda a: f"The answer is {a}.", lambda a: f"\\boxed{{{int(a) + 1}}}", lambda a: "no answer"]
    for i in range(n):
        row = rows[i % len(rows)]
        thinking = row["solution"].split("</think>")[0] + "</think>\n\n"
        comps.append(thinking + rng.choice(forms)(row["answer"]))
        golds.append(row["answer"])
    return comps, golds


ADVERSARIAL = [
    lambda i: "\\boxed{2^{2^{2^{" + str(100 + i) + "}}}}",
    lambda i: "\\boxed{" + "9" * 1_000_000 + "}",
    lambda i: "\\boxed{" + "{" * (2000 + i) + "1" + "}" * (2000 + i) + "}",
    lambda i: "\\boxed{\\frac{1}{" + "{" * i,
    lambda i: "\\boxed{" + "\\sqrt{" * 400 + "2" + "}" * 400 + "}",
    lambda i: "\\boxed{10^{10^{10^{" + str(i + 2) + "}}}!}",
    lambda i: "\\boxed{" + "+".join(["x^{99999}"] * 300) + "}",
    lambda i: "\\boxed{(" * 300,
    lambda i: "\\boxed{\\int_0^{\\infty} e^{-x^{" + str(i + 5) + "}} dx}",
    lambda i: "\\boxed{" + "\\left(" * 200 + "1" + "\\right)" * 200 + "}",
]


def alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=float, default=5.0)
    args = ap.parse_args()

    from toolkit.rewards.math import score_math, shared_pool

    comps, golds = completions(args.n)
    items = [(g, c, True) for g, c in zip(golds, comps)]
    pool = shared_pool(args.workers, args.timeout)
    # The same warm-up on both sides, outside the timed region: the pool's workers start (as in a
    # long-lived trainer) and the sequential loop's first calls load sympy's parsers and caches.
    pool.map(items[:64])
    [score_math(*it) for it in items[:64]]

    t0 = time.perf_counter()
    sequential = [score_math(*it) for it in items]
    t_seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    pooled = pool.map(items)
    t_pool = time.perf_counter() - t0
    assert pooled == sequential, "pooled scores differ from the sequential loop"
    print(f"{args.n} completions, {args.workers} workers on {os.cpu_count()} cores")
    print(f"  sequential: {t_seq:.2f} s ({args.n / t_seq:.0f}/s)")
    print(f"  pooled:     {t_pool:.2f} s ({args.n / t_pool:.0f}/s)")
    print(f"  speed-up:   {t_seq / t_pool:.2f}x  (scores identical: {pooled == sequential}, "
          f"mean accuracy {sum(s or 0 for s in pooled) / len(pooled):.3f})")

    adversarial = [ADVERSARIAL[i % len(ADVERSARIAL)](i) for i in range(50)]
    before = pool.timeouts
    t0 = time.perf_counter()
    scores = pool.map([("1", a, True) for a in adversarial])
    t_adv = time.perf_counter() - t0
    worst = max(pool.durations)
    spawned = list(pool.spawned)
    pool.close()
    time.sleep(0.5)
    stray = [p for p in spawned if alive(p)]
    print(f"adversarial: 50 answers in {t_adv:.1f} s; {pool.timeouts - before} timed out; "
          f"slowest sample {worst:.2f} s (limit {args.timeout + 1:.0f} s); all scored 0: {all(s == 0.0 for s in scores)}; "
          f"stray processes after close: {len(stray)}")
    assert all(s == 0.0 for s in scores) and worst <= args.timeout + 1 and not stray


if __name__ == "__main__":
    main()
