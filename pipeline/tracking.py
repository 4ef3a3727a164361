"""MLflow bookkeeping: one parent run per pipeline run, one nested child run per stage.

Workers log their own training metrics into the child run (HF's MLflow callback, pointed at it by
MLFLOW_RUN_ID); this module creates the runs, logs resolved configs as params, closes runs with
the right status, and draws the stage comparison on the parent.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from pipeline.home import tracking_uri

UI_URL = os.environ.get("POSTTRAIN_MLFLOW_UI", "http://127.0.0.1:5000")


def client():
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    return mlflow.MlflowClient(tracking_uri())


def experiment_id(recipe: str) -> str:
    c = client()
    name = f"posttrain/{recipe}"
    exp = c.get_experiment_by_name(name)
    return exp.experiment_id if exp else c.create_experiment(name)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:5000]
    return out


def log_params(run_id: str, params: dict[str, str]) -> None:
    import mlflow

    items = [mlflow.entities.Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), 100):
        client().log_batch(run_id, params=items[i:i + 100])


def start_pipeline_run(recipe: str, profile: str | None, overrides: list[str], run_name: str) -> str:
    c = client()
    run = c.create_run(experiment_id(recipe), run_name=run_name,
                       tags={"posttrain.kind": "pipeline", "posttrain.recipe": recipe})
    log_params(run.info.run_id, {"recipe": recipe, "profile": str(profile), "overrides": " ".join(overrides) or "-",
                                 "git_commit": git_commit()})
    return run.info.run_id


def start_stage_run(parent_id: str, recipe: str, stage_name: str, kind: str, config: dict,
                    cache_key: str, cached_from: str | None = None) -> str:
    tags = {"mlflow.parentRunId": parent_id, "posttrain.kind": "stage", "posttrain.stage": stage_name,
            "posttrain.stage_kind": kind, "posttrain.cache_key": cache_key}
    if cached_from:
        tags["posttrain.cached_from"] = cached_from
    run = client().create_run(experiment_id(recipe), run_name=stage_name, tags=tags)
    # Prefixed so they never clash with the TrainingArguments params HF's callback logs.
    log_params(run.info.run_id, flatten(config, "stage."))
    return run.info.run_id


def log_metrics(run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    import mlflow

    ts = int(time.time() * 1000)
    client().log_batch(run_id, metrics=[mlflow.entities.Metric(k, float(v), ts, step) for k, v in metrics.items()])


def end_run(run_id: str, ok: bool) -> None:
    client().set_terminated(run_id, "FINISHED" if ok else "FAILED")


def run_url(run_id: str) -> str:
    run = client().get_run(run_id)
    return f"{UI_URL}/#/experiments/{run.info.experiment_id}/runs/{run_id}"


def log_stage_comparison(parent_id: str, stages: list[dict]) -> None:
    """A bar chart of every stage's eval metrics and a JSON table, on the pipeline's parent run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = client()
    names = [s["name"] for s in stages]
    keys = sorted({k for s in stages for k in s["metrics"] if k.startswith("eval/") and k not in ("eval/n", "eval/unjudged")})
    if not keys:
        return
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        ax.bar(names, [s["metrics"].get(key, 0.0) for s in stages], color="#4C72B0")
        ax.set_title(key.removeprefix("eval/"), fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle("evaluation after each stage")
    fig.tight_layout()
    c.log_figure(parent_id, fig, "stage_comparison.png")
    plt.close(fig)
    c.log_dict(parent_id, {s["name"]: s["metrics"] for s in stages}, "stage_metrics.json")
