"""Orchestration overhead of the grpo stage: the same GRPO configuration through `posttrain run`
and through a plain TRL script (benchmarks/plain_trl_grpo.py), timed in one process run.

Reports two ratios against the plain script's wall time (process start to exit):
- stage: the stage as the flow runs it (worker process start, data, sampler, MLflow logging, the
  final save, the output's checksum), as the flow measured it. Target: at most 1.10. Both sides
  use the same knobs (fp32, no gradient checkpointing: TRL's own defaults differ) and neither
  writes intermediate checkpoints.
- pipeline: the whole `posttrain run` command, including Prefect's temporary server, MLflow set-up
  and run records; a fixed cost per pipeline, not per stage.

Usage: .venv/bin/python benchmarks/bench_grpo_overhead.py [--profile demo] [--steps 20]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def recipe_yaml(cfg: dict) -> str:
    return f"""name: grpo_overhead
description: one grpo stage, sized by bench_grpo_overhead.py
stages:
  - name: rl
    kind: grpo
    model: {cfg['model']}
    evaluate: false
    data: {{source: synthetic_math, n: {cfg['rows']}, params: {{difficulties: [1]}}}}
    loss: grpo
    rewards: [{{name: accuracy_math}}, {{name: format_think}}]
    num_generations: {cfg['G']}
    per_device_batch_size: {cfg['batch']}
    max_completion_length: {cfg['max_completion_length']}
    learning_rate: {cfg['lr']}
    beta: {cfg['beta']}
    max_steps: {cfg['steps']}
    save_steps: {cfg['steps'] + 1000}     # no checkpoint: the plain script writes none either
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="demo", help="whose `base` model to train")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--max-completion-length", type=int, default=64)
    a = ap.parse_args()

    from pipeline.recipe import load_recipe

    work = Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    env = {**os.environ, "POSTTRAIN_HOME": str(work / "home")}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PREFECT_HOME", None)
    os.environ.update(POSTTRAIN_HOME=env["POSTTRAIN_HOME"])
    from pipeline.models.named import resolve_model

    base = load_recipe("r1_zero", a.profile).recipe.stages[0].model
    model_dir = str(resolve_model(base))
    cfg = {"model": model_dir, "rows": 256, "G": 8, "batch": 16, "max_completion_length": a.max_completion_length,
           "lr": 1e-5, "beta": 0.04, "steps": a.steps}
    (work / "recipe.yaml").write_text(recipe_yaml(cfg))
    (work / "plain.json").write_text(json.dumps(cfg))
    py = sys.executable
    posttrain = str(Path(py).parent / "posttrain")

    t = time.time()
    subprocess.run([py, str(ROOT / "benchmarks" / "plain_trl_grpo.py"), "--config", str(work / "plain.json"),
                    "--out", str(work / "plain")], cwd=ROOT, env=env, check=True, capture_output=True)
    plain_s = time.time() - t

    t = time.time()
    subprocess.run([posttrain, "run", str(work / "recipe.yaml")], cwd=ROOT, env=env, check=True, capture_output=True)
    pipeline_s = time.time() - t
    record = json.loads(sorted((work / "home" / "runs").glob("*.json"))[-1].read_text())
    stage_s = next(s for s in record["stages"] if s["name"] == "rl")["duration_s"]

    print(f"model {base} ({model_dir}); {a.steps} steps, G={cfg['G']}, {cfg['batch']} completions/step, "
          f"max {cfg['max_completion_length']} new tokens")
    print("| plain TRL script | posttrain stage | ratio stage/plain | posttrain run (whole) | ratio run/plain |")
    print(f"| {plain_s:.1f} s | {stage_s:.1f} s | {stage_s / plain_s:.3f} | {pipeline_s:.1f} s | {pipeline_s / plain_s:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
