"""Two rollout costs of issue 12, each measured against its baseline in one run:

1. Budgeted generation (two phases: thinking up to the budget, the stop-thinking string, then the
   answer from the sequence so far) against one unbudgeted `generate` call: seconds per generated
   token (inserted stop-string tokens count as output). Target: ratio at most 1.15.
2. Rejection-sampling rollouts with prompts batched by length (what the stage does) against the
   recipe's own order: completions per second.

    .venv/bin/python benchmarks/bench_thinking_budget.py [--model smollm2-135m-instruct] [--prompts 32]
"""

from __future__ import annotations

import argparse
import time

from data_curation.sources import load_rows
from pipeline.models.named import resolve_model
from pipeline.store.home import configure_environment
from toolkit.rollouts import SamplingSpec, open_engine


def timed_generation(engine, prompts, spec: SamplingSpec) -> tuple[float, int, list]:
    started = time.perf_counter()
    done = [c for cs in engine.complete(prompts, spec) for c in cs]
    return time.perf_counter() - started, sum(c.tokens for c in done), done


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--budget", type=int, default=96)
    ap.add_argument("--answer", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--engine", default="hf", help="hf, ct2 or auto (toolkit.rollouts.engines)")
    ap.add_argument("--samples", type=int, default=4, help="rejection sampling: completions per prompt")
    args = ap.parse_args()
    configure_environment()
    engine = open_engine(resolve_model(args.model), args.engine)
    rows = load_rows("synthetic_math", "train", args.prompts, 0, {})
    prompts = [r["prompt"] for r in rows]
    engine.complete(prompts[:2], SamplingSpec(max_new_tokens=8))  # warm-up

    budgeted = SamplingSpec(max_new_tokens=args.budget + args.answer, thinking_budget=args.budget,
                            answer_max_new_tokens=args.answer, batch_size=args.batch_size)
    t_b, n_b, done = timed_generation(engine, prompts, budgeted)
    plain = SamplingSpec(max_new_tokens=max(c.tokens for c in done), batch_size=args.batch_size)
    t_p, n_p, _ = timed_generation(engine, prompts, plain)
    hit = sum(c.budget_hit for c in done)
    print(f"model {args.model}, {len(prompts)} prompts, batch {args.batch_size}, budget {args.budget}, answer {args.answer}")
    print(f"budgeted:   {t_b:7.2f} s  {n_b:6d} tokens  {1e3 * t_b / n_b:6.2f} ms/token  (budget hit in {hit}/{len(done)})")
    print(f"unbudgeted: {t_p:7.2f} s  {n_p:6d} tokens  {1e3 * t_p / n_p:6.2f} ms/token")
    print(f"ratio (budgeted / unbudgeted, per token): {(t_b / n_b) / (t_p / n_p):.3f}  (target <= 1.15)")

    mixed = load_rows("synthetic_math", "train", args.prompts, 1, {"difficulties": [1, 5]})
    as_given = [r["prompt"] for r in mixed]
    by_length = sorted(as_given, key=lambda p: len(str(p)))
    spec = SamplingSpec(max_new_tokens=args.answer, temperature=0.7, top_p=0.95, n=args.samples,
                        batch_size=max(1, args.batch_size // args.samples))
    t_given, _, _ = timed_generation(engine, as_given, spec)
    t_sorted, _, _ = timed_generation(engine, by_length, spec)
    n = len(mixed) * args.samples
    print(f"rejection-sampling rollouts, {n} completions: recipe order {n / t_given:.2f}/s, "
          f"batched by length {n / t_sorted:.2f}/s, speed-up {t_given / t_sorted:.2f}x")


if __name__ == "__main__":
    main()
