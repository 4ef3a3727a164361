"""Budgeted generation on ONNX Runtime GenAI in one pass against the two-phase path, in one run
(issue: fast generation; qwen3's evaluation runs budgets 0, 16, 64 and unlimited on every prompt).

The two-phase path (the baseline; what every other engine runs) generates each row's thinking up to
its budget, then feeds every unfinished row (prompt, thinking, inserted stop-thinking string) through
the model again to generate its answer. In one pass the stop-thinking string is forced into the
row's own generation and the answer follows in the same generator. Printed per budget: seconds
each way, their ratio, and how many greedy completions are the same text with the same token counts.

    .venv/bin/python benchmarks/bench_budget_one_pass.py --model <a model that thinks, e.g. a qwen3
        demo run's general_rl/model> [--prompts 200] [--budgets 16 64] [--answer 32] [--batch-size 64]
"""

from __future__ import annotations

import functools
import time

from recipe_runs import budget_benchmark_parser, non_negative_int, same_completions


def main() -> None:
    from data_curation.sources import load_rows
    from pipeline.models.named import resolve_model
    from pipeline.store.home import configure_environment
    from toolkit.rollouts import SamplingSpec
    from toolkit.rollouts.engines import thread_budget
    from toolkit.rollouts.hf import load_tokenizer
    from toolkit.rollouts.ort import converted, open_model, ort_sampler
    from toolkit.rollouts.sampling import complete

    args = budget_benchmark_parser(__doc__, non_negative_int).parse_args()
    configure_environment()
    model_dir = resolve_model(args.model)
    tokenizer = load_tokenizer(model_dir)
    model = open_model(converted(model_dir, "float32"), thread_budget())
    prompts = [r["prompt"] for r in load_rows("synthetic_math", "eval", args.prompts, 0, {})]
    print(f"model {args.model}: {len(prompts)} held-out prompts, greedy, answer limit {args.answer}, "
          f"batch {args.batch_size}, {thread_budget()} thread(s)")
    print("| budget | two-phase s | one pass s | one pass / two-phase | same completions | budget hit |")
    print("| --- | --- | --- | --- | --- | --- |")
    for budget in args.budgets:
        spec = SamplingSpec(max_new_tokens=budget + args.answer, thinking_budget=budget,
                            answer_max_new_tokens=args.answer, batch_size=args.batch_size)
        runs = {}
        for name in ("two-phase", "one pass"):
            sample = ort_sampler(model, tokenizer)
            if name == "two-phase":  # the same sampler without its one-pass budget
                sample = functools.partial(sample)
            started = time.perf_counter()
            done = [cs[0] for cs in complete(sample, tokenizer, prompts, spec)]
            runs[name] = (time.perf_counter() - started, done)
        (t2, two), (t1, one) = runs["two-phase"], runs["one pass"]
        same = same_completions(two, one)
        print(f"| {budget} | {t2:.1f} | {t1:.1f} | {t1 / t2:.2f}x | {same}/{len(prompts)} | "
              f"{sum(c.budget_hit for c in one)}/{len(prompts)} |", flush=True)


if __name__ == "__main__":
    main()
