"""Training in bfloat16 autocast against float32 on demo: is it faster here, and is it safe?

Runs benchmarks/recipes/bf16_training.yaml in a fresh home: an SFT cold start from SmolLM2 in each
precision, and GRPO in each precision from the float32 cold start (the arms differ in `bf16` only).
Every model is evaluated greedily on the same TRAINING-split prompts (levels 1-3, seed 99, never
trained on; not the held-out sets, so turning bf16 on is not decided on them). Prints, as markdown
for benchmarks/RESULTS.md:
- per stage: the trainer's own runtime and its ratio to the float32 arm's (the baseline, measured in
  the same run), the first and last training loss, and, for GRPO, reward and KL in the first and
  last fifth of the steps;
- per stage: accuracy with its 95% interval, and the bf16 arm's paired change against the float32
  arm on the same prompts (`pipeline.gates.change_metrics`): the safety claim is that this interval
  holds 0 and is not wider than a few points.

    .venv/bin/python benchmarks/bench_bf16_training.py [--profile demo] [--prompts 200]

About 20 minutes on demo on 2 cores; nothing else should share the machine while it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recipe_runs import ROOT, fresh_home, latest_stages, positive_int, run_recipe, table_header, table_row

ARMS = {"sft": ("cold_fp32", "cold_bf16"), "grpo": ("rl_fp32", "rl_bf16")}


def scores(stage: dict) -> dict:
    from stages.evaluate import EVAL_SCORES

    return json.loads((Path(stage["output_dir"]) / EVAL_SCORES).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--prompts", type=positive_int, default=200, help="training-split prompts each model is judged on")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from pipeline.gates import change_metrics

    home, env = fresh_home("bench-bf16-training-")
    judged = (f"eval.data={{source: synthetic_math, split: train, n: {a.prompts}, seed: 99, "
              "params: {difficulties: [1, 2, 3]}}")
    _, wall = run_recipe(str(ROOT / "benchmarks" / "recipes" / "bf16_training.yaml"), env, "--profile", a.profile,
                         "--set", judged, "--set", "eval.max_new_tokens=128")
    stages = {s["name"]: s for s in latest_stages(env)}
    print(f"profile {a.profile}, home {home}, {wall:.0f} s in all; {a.prompts} training-split prompts of levels 1-3, "
          "greedy, 128 tokens\n")
    print(table_header("kind", "precision", "train runtime s", "vs float32", "loss first -> last",
                       "reward first -> last fifth", "KL last fifth"))
    for kind, (fp32, bf16) in ARMS.items():
        base = stages[fp32]["metrics"]["train/runtime_s"]
        for name in (fp32, bf16):
            m = stages[name]["metrics"]
            reward = (f"{m['train/reward_first_fifth']:.3f} -> {m['train/reward_last_fifth']:.3f}"
                      if "train/reward_first_fifth" in m else "")
            kl = f"{m['train/kl_last_fifth']:.4f}" if "train/kl_last_fifth" in m else ""
            print(table_row(kind, "bfloat16 autocast" if name == bf16 else "float32 (baseline)",
                            f"{m['train/runtime_s']:.1f}", f"{m['train/runtime_s'] / base:.2f}",
                            f"{m['train/first_loss']:.4f} -> {m['train/final_loss']:.4f}", reward, kl))
    print()
    print(table_header("kind", "float32 accuracy [95%]", "bfloat16 accuracy [95%]", "bf16 - fp32, paired [95%]",
                       "McNemar p", "format rate fp32 / bf16"))
    for kind, (fp32, bf16) in ARMS.items():
        f, b = stages[fp32]["metrics"], stages[bf16]["metrics"]
        change = change_metrics(scores(stages[bf16]), scores(stages[fp32]))
        print(table_row(kind, f"{f['eval/accuracy']:.3f} [{f['eval/accuracy_lo']:.3f}, {f['eval/accuracy_hi']:.3f}]",
                        f"{b['eval/accuracy']:.3f} [{b['eval/accuracy_lo']:.3f}, {b['eval/accuracy_hi']:.3f}]",
                        f"{change['change/eval/accuracy']:+.3f} [{change['change/eval/accuracy_lo']:+.3f}, "
                        f"{change['change/eval/accuracy_hi']:+.3f}]", f"{change.get('change/eval/accuracy_p', float('nan')):.2f}",
                        f"{f['eval/format_rate']:.3f} / {b['eval/format_rate']:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
