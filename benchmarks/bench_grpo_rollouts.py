"""GRPO step time with TRL's own rollouts (HF generate) against ONNX Runtime GenAI rollouts with the
policy's weights written into its graph every step (`rollout: ort`), and against those rollouts with
the log-probabilities computed over length buckets of 4 completions, each group's shared prompt run
once (`length_bucket_rows: 4`, the training half of a step; issue: fast generation).

One grpo stage as the demo's RL stages run it (G = 8, 16 completions per step, `--tokens` new
tokens, accuracy and format rewards, synthetic_math levels 1-3, beta 0.04 so the reference model's
forward is in every step), run three times in one fresh home from the same model, one after the
other. Printed per run, from the stage's MLflow run: seconds per step (TRL's `step_time`, mean over
the steps after the first), of which rollouts (`rollout/seconds`: generation, the weight refresh,
reward scoring and the reference model's forward) and the refresh alone (`rollout/refresh_s`), the
mean reward and completion length over all steps, and the ratio of step times against HF in the
same run. The two engines draw from different random streams, so rewards agree only in
distribution; the two ORT runs share the seed, so they differ only by the buckets' float rounding.

    .venv/bin/python benchmarks/bench_grpo_rollouts.py [--model smollm2-135m-instruct] [--steps 6] [--tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from recipe_runs import fresh_home, run_recipe, table_header, table_row

RECIPE = """name: grpo_rollouts
description: one grpo stage, sized by bench_grpo_rollouts.py
stages:
  - name: rl
    kind: grpo
    model: {model}
    evaluate: false
    data: {{source: synthetic_math, n: 256, seed: 3, params: {{difficulties: [1, 2, 3]}}}}
    rewards: [{{name: accuracy_math}}, {{name: format_think}}]
    num_generations: 8
    per_device_batch_size: 16
    max_completion_length: {tokens}
    learning_rate: 1.0e-6
    max_steps: {steps}
    save_steps: 1000
"""


VARIANTS = [("TRL's HF generate, one padded batch (baseline)", ["stages.rl.rollout=hf"]),
            ("ONNX Runtime GenAI, one padded batch", ["stages.rl.rollout=ort"]),
            ("ONNX Runtime GenAI, buckets of 4", ["stages.rl.rollout=ort", "stages.rl.length_bucket_rows=4"])]


def latest_histories(home: Path) -> dict[str, list[float]]:
    """Per-step metrics of the latest finished `rl` stage run in the home's MLflow store."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("posttrain/grpo_rollouts")
    run = client.search_runs(experiment.experiment_id, "tags.`posttrain.stage` = 'rl' and attributes.status = 'FINISHED'",
                             order_by=["attributes.start_time DESC"], max_results=1)[0]
    keys = ("step_time", "rollout/seconds", "rollout/refresh_s", "reward", "completions/mean_length")
    return {k: [m.value for m in sorted(client.get_metric_history(run.info.run_id, k), key=lambda m: m.step)]
            for k in keys}


def after_first(values: list[float]) -> float:
    """The mean over the steps after the first (which loads the model and converts it), or of the
    one step there is."""
    return statistics.mean(values[1:] or values) if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="named model or directory")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()

    home, env = fresh_home("bench-grpo-rollouts-")
    recipe = home / "grpo_rollouts.yaml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(RECIPE.format(model=args.model, tokens=args.tokens, steps=args.steps))
    rows, base = [], None
    for label, sets in VARIANTS:
        run_recipe(str(recipe), env, *[a for s in sets for a in ("--set", s)])
        h = latest_histories(home)
        step = after_first(h["step_time"])
        base = base or step
        refresh = after_first(h["rollout/refresh_s"])
        rows.append(table_row(label, f"{step:.1f}", f"{after_first(h['rollout/seconds']):.1f}",
                              f"{refresh:.2f}" if h["rollout/refresh_s"] else "",
                              f"{statistics.mean(h['reward']):.3f}", f"{statistics.mean(h['completions/mean_length']):.1f}",
                              f"{step / base:.2f}"))
    print(f"model {args.model}; {args.steps} steps of 16 completions (G = 8), at most {args.tokens} new tokens; home {home}")
    print(table_header("rollouts, log-probabilities", "s per step", "of which rollouts", "of which weight refresh", "mean reward",
                       "mean length", "step time vs HF"))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
