"""Sampled generation on ONNX Runtime GenAI with and without the tail restart (toolkit/rollouts/ort.py,
`TAIL_SHARE`): once the unfinished rows of a generator are a quarter of its rows or fewer, they go on
in a generator of their own (issue: fast generation).

GRPO's rollouts are the shape measured: `--groups` prompts of `synthetic_math` levels 1-3 (training
split) with `--rows` copies each, sampled at temperature 1 over the whole distribution (the torch draw
through `set_logits`), at most `--tokens` new tokens, through `ort_sampler` as the rollouts call it.
The same `--calls` calls (seeds 0, 1, ...) run with the restart off and on, alternating, so drift in
the machine's speed falls on both. Printed per setting: seconds per call (mean), tokens per second,
and, to show the draws follow the same law, the mean completion length and the share of rows cut at
the limit (the restart changes the random stream, not the distribution).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_ort_tail.py --model <dir> [--groups 2] [--rows 8] [--tokens 128]
        [--calls 8] [--share 4] [--min-steps 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from data_curation.sources import load_rows
from pipeline.models.named import resolve_model
from pipeline.store.home import configure_environment
from toolkit.rollouts import ort
from toolkit.rollouts.sampling import SamplingSpec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="named model or directory")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--share", type=int, default=ort.TAIL_SHARE, help="TAIL_SHARE for the restart-on setting")
    ap.add_argument("--min-steps", type=int, default=ort.TAIL_MIN_STEPS, help="TAIL_MIN_STEPS for it")
    args = ap.parse_args()
    configure_environment()
    from transformers import AutoTokenizer

    model_dir = str(resolve_model(args.model))
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sample = ort.ort_sampler(ort.open_model(ort.converted(model_dir, "float32"), threads), tokenizer)
    prompts = [r["prompt"] for r in load_rows("synthetic_math", "train", args.groups * args.calls, 3,
                                              {"difficulties": [1, 2, 3]})]
    ort.TAIL_MIN_STEPS = args.min_steps
    settings = {"restart off (baseline)": 10**9,
                f"restart on (TAIL_SHARE {args.share}, TAIL_MIN_STEPS {args.min_steps})": args.share}
    seconds = {label: [] for label in settings}
    lengths = {label: [] for label in settings}
    for call in range(args.calls):
        group = prompts[call * args.groups:(call + 1) * args.groups]
        seqs = [tokenizer(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False)["input_ids"] for p in group for _ in range(args.rows)]
        for label, share in settings.items():
            ort.TAIL_SHARE = share
            started = time.perf_counter()
            rows = sample(seqs, args.tokens, False, SamplingSpec(max_new_tokens=args.tokens, temperature=1.0, seed=call))
            seconds[label].append(time.perf_counter() - started)
            lengths[label].extend(len(r) for r in rows)
    base = statistics.mean(seconds["restart off (baseline)"])
    print(f"model {model_dir}; {args.calls} calls of {args.groups} prompts x {args.rows} rows, at most {args.tokens} "
          f"new tokens, temperature 1, {threads} threads")
    print("| setting | s per call (mean) | tokens/s | mean length | rows at the limit | time vs off |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label in settings:
        s, n = statistics.mean(seconds[label]), lengths[label]
        print(f"| {label} | {s:.2f} | {sum(n) / sum(seconds[label]):.1f} | {statistics.mean(n):.1f} | "
              f"{sum(x >= args.tokens for x in n) / len(n):.2f} | {s / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
