"""Does a sampled OpenVINO call draw the same completions at every batch size, and how long does it
take at each? The sampler seeds each row by its place among the rows drawn (toolkit.rollouts.ov), so
the batch size should change only the time. Prints seconds per batch size (each timed twice) and how
many completions equal batch 16's.

    .venv/bin/python benchmarks/bench_ov_batch.py MODEL --prompts 192 --max-new-tokens 32 --temperature 1.0

The prompts are `synthetic_math` training rows of levels 1-3 (seed 21, as qwen3's demo query filter
draws them). MODEL is a model folder or a named model.
"""

from __future__ import annotations

import argparse
import sys
import time

from recipe_runs import ROOT, positive_int, same_completions, table_header, table_row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--prompts", type=positive_int, default=192)
    ap.add_argument("--max-new-tokens", type=positive_int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--batches", default="16,64,192", help="comma-separated; the first is the baseline")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from data_curation.sources import synthetic_math
    from pipeline.models.named import resolve_model
    from pipeline.store.home import configure_environment
    from stages.common import GenerationSpec
    from toolkit.rollouts import SamplingSpec

    configure_environment()
    prompts = [r["prompt"] for r in synthetic_math.rows(split="train", n=a.prompts, seed=21, difficulties=[1, 2, 3])]
    engine = GenerationSpec(engine="ov").open(str(resolve_model(a.model)))
    engine.complete(prompts[:4], SamplingSpec(max_new_tokens=8))  # warm-up
    batches = [int(b) for b in a.batches.split(",")]
    print(table_header("batch", "seconds (two calls)", "x the first batch's", "completions equal to the first batch's"))
    baseline, first_s = None, None
    for batch in batches:
        times, done = [], []
        for _ in range(2):
            spec = SamplingSpec(max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                                top_p=0.95 if a.temperature < 1 else 1.0, batch_size=batch, seed=0)
            started = time.perf_counter()
            done.append([c[0] for c in engine.complete(prompts, spec)])
            times.append(time.perf_counter() - started)
        baseline = baseline or done[0]
        first_s = first_s or min(times)
        print(table_row(batch, ", ".join(f"{t:.1f}" for t in times), f"{first_s / min(times):.2f}",
                        f"{same_completions(baseline, done[0])} of {len(prompts)} "
                        f"(its repeat {same_completions(done[0], done[1])})"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
