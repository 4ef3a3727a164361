"""Step time of on-policy distillation (the `distill` stage, `mode: on_policy`) through posttrain
against a plain TRL GKD script (benchmarks/plain_trl_gkd.py) with the same settings, in one run.

Both sides: the profile's student learns from its teacher, lambda 1 (every batch student-generated),
the same beta, temperature, new tokens, batch, steps, constant learning rate, fp32, no gradient
checkpointing, no intermediate checkpoints, no evaluation. The stage's time is the flow's measure of
the stage (worker start, data, MLflow logging, the final save and its checksum); the ratio target is
at most 1.10. The whole `posttrain run` is printed too (a fixed cost per pipeline, not per stage).

Usage: .venv/bin/python benchmarks/bench_gkd_overhead.py [--profile demo] [--steps 12]
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
    return f"""name: gkd_overhead
description: one on-policy distill stage, sized by bench_gkd_overhead.py
stages:
  - name: distill
    kind: distill
    mode: on_policy
    student: {cfg['student']}
    teacher: {cfg['teacher']}
    evaluate: false
    probe_prompts: 0
    data: {{source: synthetic_math, n: {cfg['rows']}, params: {{difficulties: [1]}}}}
    lmbda: 1.0
    beta: {cfg['beta']}
    temperature: {cfg['temperature']}
    max_new_tokens: {cfg['max_new_tokens']}
    max_length: {cfg['max_length']}
    per_device_batch_size: {cfg['batch']}
    learning_rate: {cfg['lr']}
    lr_scheduler: constant
    max_steps: {cfg['steps']}
    save_steps: {cfg['steps'] + 1000}     # no checkpoint: the plain script writes none either
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="demo", help="whose student and teacher to use")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-gkd-"))
    env = {**os.environ, "POSTTRAIN_HOME": str(work / "home")}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PREFECT_HOME", None)
    os.environ.update(POSTTRAIN_HOME=env["POSTTRAIN_HOME"])
    from pipeline.models.named import resolve_model
    from pipeline.recipe import load_recipe

    stages = {s.name: s for s in load_recipe("qwen3", a.profile).recipe.stages}  # the profile's student, teacher
    models = {"student": stages["distill_off"].student, "teacher": stages["query_filter"].model}
    cfg = {"student": str(resolve_model(models["student"])), "teacher": str(resolve_model(models["teacher"])),
           "rows": 128, "batch": 4, "max_new_tokens": a.max_new_tokens, "max_length": 256, "beta": 0.5,
           "temperature": 0.9, "lr": 1e-5, "steps": a.steps}
    (work / "recipe.yaml").write_text(recipe_yaml(cfg))
    (work / "plain.json").write_text(json.dumps(cfg))
    py = sys.executable

    t = time.time()
    subprocess.run([py, str(ROOT / "benchmarks" / "plain_trl_gkd.py"), "--config", str(work / "plain.json"),
                    "--out", str(work / "plain")], cwd=ROOT, env=env, check=True, capture_output=True)
    plain_s = time.time() - t

    t = time.time()
    subprocess.run([str(Path(py).parent / "posttrain"), "run", str(work / "recipe.yaml")], cwd=ROOT, env=env,
                   check=True, capture_output=True)
    pipeline_s = time.time() - t
    record = json.loads(sorted((work / "home" / "runs").glob("*.json"))[-1].read_text())
    stage_s = next(s for s in record["stages"] if s["name"] == "distill")["duration_s"]

    print(f"student {models['student']}, teacher {models['teacher']}; {a.steps} steps, batch {cfg['batch']}, "
          f"lambda 1, beta {cfg['beta']}, max {cfg['max_new_tokens']} new tokens")
    print("| plain TRL GKD script | posttrain stage | ratio stage/plain | posttrain run (whole) | ratio run/plain |")
    print(f"| {plain_s:.1f} s | {stage_s:.1f} s | {stage_s / plain_s:.3f} | {pipeline_s:.1f} s | {pipeline_s / plain_s:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
