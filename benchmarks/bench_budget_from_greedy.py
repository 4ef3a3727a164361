"""Thinking budgets derived from the evaluation's greedy pass against generated anew, in one run
(issue: fast generation; qwen3's evaluation runs budgets 0, 16, 64 and unlimited on every prompt).

An evaluation with budgets already has the greedy pass on the same prompts (budget unlimited). The
baseline generates each budget from scratch (on ONNX Runtime GenAI: the stop-thinking string forced
into each row's own generation). Derived (`Engine.complete_budgeted`): each row's first B tokens and,
where its thinking closed within them, its answer come from the greedy pass; only the rows whose
budget ran out (or whose greedy completion stopped at its token limit too early to tell) are
generated, from prompt + thinking + stop string. Printed per budget: seconds each way, their ratio,
how many completions are the same (text, token counts, thinking tokens, budget flag) and the rows
the derived way generated. The greedy pass is timed once; both ways would need it.

    .venv/bin/python benchmarks/bench_budget_from_greedy.py --model <a model that thinks, e.g. a qwen3
        demo run's general_rl/model> [--prompts 200] [--budgets 16 64] [--max-new-tokens 80]
        [--answer 32] [--batch-size 64]
"""

from __future__ import annotations

import time

from recipe_runs import budget_benchmark_parser, positive_int, same_completions


def main() -> None:
    from data_curation.sources import load_rows
    from pipeline.models.named import resolve_model
    from pipeline.store.home import configure_environment
    from toolkit.rollouts import SamplingSpec, open_engine

    ap = budget_benchmark_parser(__doc__)
    ap.add_argument("--max-new-tokens", type=positive_int, default=80, help="the greedy pass's limit, as qwen3's demo evaluation")
    args = ap.parse_args()
    configure_environment()
    engine = open_engine(resolve_model(args.model))
    prompts = [r["prompt"] for r in load_rows("synthetic_math", "eval", args.prompts, 0, {})]
    started = time.perf_counter()
    greedy = [cs[0] for cs in engine.complete(prompts, SamplingSpec(max_new_tokens=args.max_new_tokens,
                                                                    batch_size=args.batch_size))]
    print(f"model {args.model} on {engine.describe()}: {len(prompts)} held-out prompts, greedy, "
          f"answer limit {args.answer}, batch {args.batch_size}; the greedy pass "
          f"({args.max_new_tokens} tokens) took {time.perf_counter() - started:.1f} s")
    print("| budget | generated s | derived s | derived / generated | same completions | rows cut, continued |")
    print("| --- | --- | --- | --- | --- | --- |")
    totals = [0.0, 0.0]
    for budget in args.budgets:
        spec = SamplingSpec(max_new_tokens=args.max_new_tokens, thinking_budget=budget,
                            answer_max_new_tokens=args.answer, batch_size=args.batch_size)
        started = time.perf_counter()
        generated = [cs[0] for cs in engine.complete(prompts, spec)]
        t_generated = time.perf_counter() - started
        started = time.perf_counter()
        derived = [cs[0] for cs in engine.complete_budgeted(prompts, spec, greedy)]
        t_derived = time.perf_counter() - started
        totals = [totals[0] + t_generated, totals[1] + t_derived]
        same = same_completions(generated, derived)
        continued = sum(c.budget_hit for c in derived)
        print(f"| {budget} | {t_generated:.1f} | {t_derived:.1f} | {t_derived / t_generated:.2f}x | "
              f"{same}/{len(prompts)} | {continued} |", flush=True)
    print(f"| all | {totals[0]:.1f} | {totals[1]:.1f} | {totals[1] / totals[0]:.2f}x | | |")


if __name__ == "__main__":
    main()
