"""What computing few-row float32 linears as `(W @ x.T).T` buys HF `generate` on this CPU, and what it
and the trimmed LM heads buy a step of on-policy distillation (issues: fast generation, learning
evidence; qwen3's `distill_on` samples 4 rows a step with HF `generate`). See
toolkit/rollouts/cpu_decode.py for why: MKL packs the whole weight at every `x @ W.T` of a few rows.

Part 1, generation: greedy HF `generate` of `--tokens` new tokens (every row decodes all of them) on
`--prompts` training-split prompts of levels 1-3 in qwen3's three modes, at each `--batches` size,
torch's own linear (the baseline) and weight-major in turn, `--rounds` times. Printed: milliseconds
per decode step both ways, their ratio, and on how many prompts the two greedy outputs are the same
token for token.

Part 2, on-policy distillation: the stage's own `on_policy` (qwen3's demo settings: 4 prompts a step,
64 new tokens, temperature 0.9, reverse KL) for `--gkd-steps` steps with TRL's GKDTrainer as it is
(the baseline) and with `stages.distill.lean_gkd_trainer`, in turn, `--rounds` times. Printed: TRL's
`train_runtime` and the first and last logged loss of each run, then the ratio of the training times.

    .venv/bin/python benchmarks/bench_decode_linear.py [--student DIR] [--teacher DIR] [--prompts 64]
        [--batches 4 16 64] [--tokens 64] [--gkd-steps 8] [--rounds 2]
Defaults: the demo profile's student and qwen3's demo base as the teacher (a trained pair, e.g. a qwen3
demo home's distill_off and general_rl models, is closer to the stage).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from pathlib import Path

from recipe_runs import non_negative_int, positive_int, stage_arms_in_turn, table_header, table_row

MODES = ["think", "no_think", "default"]  # qwen3's distill_on thinking_modes


def generation(model, tokenizer, texts: list[str], batch: int, tokens: int, weight_major: bool) -> tuple[float, list]:
    """Seconds per decode step, and the greedy outputs."""
    import torch

    from toolkit.rollouts.cpu_decode import weight_major_linear

    outputs, seconds = [], 0.0
    for start in range(0, len(texts), batch):
        enc = tokenizer(texts[start:start + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        began = time.perf_counter()
        with torch.no_grad(), weight_major_linear() if weight_major else contextlib.nullcontext():
            out = model.generate(**enc, do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                                 pad_token_id=tokenizer.pad_token_id)
        seconds += time.perf_counter() - began
        outputs += out[:, enc["input_ids"].shape[1]:].tolist()
    return seconds / (len(range(0, len(texts), batch)) * tokens), outputs


def gkd_run(arm: str, student: str, teacher: str, rows: list[dict], steps: int) -> dict:
    import stages.distill
    from stages.distill import DistillConfig
    from stages.runtime import StageContext

    lean = stages.distill.lean_gkd_trainer
    if arm == "trl":
        from trl.experimental.gkd import GKDTrainer
        stages.distill.lean_gkd_trainer = lambda: GKDTrainer
    out = Path(tempfile.mkdtemp(prefix=f"bench-decode-linear-{arm}-"))
    try:
        cfg = DistillConfig(name="bench", student="student", teacher="teacher", data="synthetic_math", mode="on_policy",
                            thinking_modes=MODES, beta=1.0, lmbda=1.0, temperature=0.9, max_new_tokens=64,
                            per_device_batch_size=4, learning_rate=2e-5, max_steps=steps, save_steps=10_000,
                            logging_steps=1)
        return stages.distill.on_policy(cfg, StageContext.local(out), student, teacher, rows)
    finally:
        stages.distill.lean_gkd_trainer = lean
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--student", help="default: the demo profile's student")
    ap.add_argument("--teacher", help="default: qwen3's demo base model")
    ap.add_argument("--prompts", type=positive_int, default=64)
    ap.add_argument("--batches", type=positive_int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--tokens", type=positive_int, default=64)
    ap.add_argument("--gkd-steps", type=non_negative_int, default=8, help="0 skips part 2")
    ap.add_argument("--rounds", type=positive_int, default=2)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from data_curation.sources import load_rows
    from pipeline.models.named import resolve_model
    from pipeline.recipe import load_recipe
    from pipeline.store.home import configure_environment
    from toolkit.core.thinking import flag_messages
    from toolkit.rollouts import load_tokenizer, render, thread_budget

    configure_environment()
    stages = {s.name: s for s in load_recipe("qwen3", "demo").recipe.stages}
    student = args.student or str(resolve_model(stages["distill_off"].student))
    teacher = args.teacher or str(resolve_model(stages["query_filter"].model))
    torch.set_num_threads(thread_budget())
    tokenizer = load_tokenizer(student)
    tokenizer.padding_side = "left"
    rows = load_rows("synthetic_math", "train", max(args.prompts, 128), 8, {"difficulties": [1, 2, 3]})
    texts = [render(tokenizer, flag_messages(r["prompt"], MODES[i % 3])) for i, r in enumerate(rows[:args.prompts])]
    model = AutoModelForCausalLM.from_pretrained(student).eval()
    print(f"student {student}; teacher {teacher}; {torch.get_num_threads()} threads, torch {torch.__version__}")

    print(table_header("batch", "round", "torch linear ms/step", "weight-major ms/step", "ratio", "greedy the same"))
    for batch in args.batches:
        for r in range(args.rounds):
            base, base_out = generation(model, tokenizer, texts, batch, args.tokens, weight_major=False)
            fast, fast_out = generation(model, tokenizer, texts, batch, args.tokens, weight_major=True)
            same = sum(a == b for a, b in zip(base_out, fast_out))
            print(table_row(min(batch, len(texts)), r + 1, f"{base * 1e3:.1f}", f"{fast * 1e3:.1f}", f"{fast / base:.2f}",
                            f"{same} of {len(texts)}"), flush=True)
    del model
    if not args.gkd_steps:
        return

    print(table_header("round", "GKD trainer", "training s", "first loss", "last loss"))
    seconds = stage_arms_in_turn({"trl": {}, "lean": {}}, args.rounds,  # no path flags to check: the arm is the class
                                 lambda arm: gkd_run(arm, student, teacher, rows, args.gkd_steps),
                                 lambda r, arm, m: (r, arm, f"{m['train/runtime_s']:.1f}", f"{m['train/first_loss']:.4f}",
                                                    f"{m['train/final_loss']:.4f}"))
    print(f"on-policy distillation, {args.gkd_steps} steps x {args.rounds} rounds: lean {seconds['lean']:.1f} s, "
          f"TRL's {seconds['trl']:.1f} s, ratio {seconds['lean'] / seconds['trl']:.2f}")


if __name__ == "__main__":
    main()
