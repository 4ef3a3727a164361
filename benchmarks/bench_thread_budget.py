"""What the thread budget buys: a training worker and an evaluation sharing the cores, each with
torch's default thread pool (one thread per core each) against posttrain's budget (the launcher's
OMP_NUM_THREADS = cores / processes), in one run (issue: fast generation, threads).

Two real workloads on SmolLM2-135M-Instruct (float32), each in its own process as a worker is:
- train:    `--steps` SFT-like steps (forward and backward, AdamW) on 4 rows of 192 tokens;
- generate: HF greedy `generate` of `--tokens` new tokens for 16 prompts (an evaluation's batch).
Timed three ways: one after the other with every core each (what the flow does when stages run in
sequence; the baseline), side by side with default threads (oversubscribed: 2 x cores threads), and
side by side with the budget. Printed: wall seconds until both finish, and the ratio to the baseline.

    .venv/bin/python benchmarks/bench_thread_budget.py [--steps 6] [--tokens 48]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def work(role: str, model_dir: str, steps: int, tokens: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    started = time.perf_counter()
    if role == "train":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        batch = torch.randint(0, tokenizer.vocab_size, (4, 192))
        for _ in range(steps):
            model(input_ids=batch, labels=batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    else:
        tokenizer.padding_side = "left"
        prompts = [f"What is {i} + {2 * i + 7}? Think step by step." for i in range(16)]
        batch = tokenizer(prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            model.generate(**batch, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    print(f"{role}: {time.perf_counter() - started:.1f} s with {torch.get_num_threads()} thread(s)", flush=True)


def launch(role: str, threads: int | None, model_dir: str, args) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return subprocess.Popen([sys.executable, __file__, "--role", role, "--model-dir", model_dir,
                             "--steps", str(args.steps), "--tokens", str(args.tokens)], env=env, cwd=ROOT)


def timed(pairs: list[list[tuple[str, int | None]]], model_dir: str, args) -> float:
    """Wall seconds for groups run one after another; the processes of a group run side by side."""
    started = time.perf_counter()
    for group in pairs:
        procs = [launch(role, threads, model_dir, args) for role, threads in group]
        if any(p.wait() for p in procs):
            raise SystemExit("a workload failed")
    return time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--role", choices=["train", "generate"])
    ap.add_argument("--model-dir")
    args = ap.parse_args()
    if args.role:
        work(args.role, args.model_dir, args.steps, args.tokens)
        return 0

    sys.path.insert(0, str(ROOT))
    from pipeline.models.named import resolve_model
    from pipeline.store.home import configure_environment

    configure_environment()
    model_dir = str(resolve_model("smollm2-135m-instruct"))
    cores = os.cpu_count() or 1
    budget = max(1, cores // 2)
    rows = [("one after the other, all cores each (baseline)", [[("train", cores)], [("generate", cores)]]),
            (f"side by side, default threads ({cores} each)", [[("train", None), ("generate", None)]]),
            (f"side by side, budget ({budget} each: OMP_NUM_THREADS)", [[("train", budget), ("generate", budget)]])]
    results = [(name, timed(groups, model_dir, args)) for name, groups in rows]
    print(f"\n{cores} cores; train {args.steps} steps of 4 x 192 tokens, generate 16 x {args.tokens} tokens; SmolLM2-135M")
    print("| processes | wall s until both finish | vs baseline |\n| --- | --- | --- |")
    for name, seconds in results:
        print(f"| {name} | {seconds:.1f} | {seconds / results[0][1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
