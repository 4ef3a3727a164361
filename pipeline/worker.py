"""The process a stage runs in: `python -m pipeline.worker SPEC.json` (or one per rank under
`deepspeed`). It trains, evaluates on rank 0, logs to the MLflow run named by MLFLOW_RUN_ID, and
writes result.json into the stage's (still partial) output directory.

The spec is plain JSON written by the flow: {"kind", "stage" (resolved config), "inputs",
"output_dir", "eval" (or null), "deepspeed_config" (or null)}.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so no rank outlives its launcher."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def watch_flow(pid: int | None, every_s: float = 2.0) -> None:
    """Kill this worker's whole process group once the flow process that launched it is gone.

    PR_SET_PDEATHSIG covers direct children only; under DeepSpeed the ranks are grandchildren of
    the flow, so each rank also watches the flow's pid.
    """
    if not pid:
        return

    def loop():
        while True:
            time.sleep(every_s)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=loop, daemon=True, name="watch-flow").start()


def log_to_mlflow(metrics: dict, table: list[dict] | None, spec: dict, artifacts: list[str] = (),
                  tables: dict | None = None, tags: dict | None = None) -> None:
    """Metrics, the eval samples table, the stage's own artifacts (files in its output dir) and
    tables ({artifact file: columns}), tags (e.g. which sandbox ran model code), and the tokenizer,
    into the stage's MLflow run."""
    import mlflow

    run_id = spec.get("mlflow_run_id")
    if not run_id:
        return
    client = mlflow.MlflowClient()
    ts = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[mlflow.entities.Metric(k, float(v), ts, 0) for k, v in metrics.items()],
                     tags=[mlflow.entities.RunTag(k, str(v)) for k, v in (tags or {}).items()])
    if table:
        client.log_table(run_id, data={k: [str(r[k]) for r in table] for k in table[0]},
                         artifact_file="eval_samples.json")
    out = Path(spec["output_dir"])
    client.log_artifact(run_id, str(out / "stage_config.json"))
    for name in artifacts:
        client.log_artifact(run_id, str(out / name))
    for name, columns in (tables or {}).items():
        client.log_table(run_id, data=columns, artifact_file=name)
    tokenizer_files = [p for p in (out / "model").glob("*") if p.name.startswith(("tokenizer", "chat_template", "special_tokens"))]
    for p in tokenizer_files:
        client.log_artifact(run_id, str(p), artifact_path="tokenizer")


def run_spec(spec: dict) -> dict | None:
    """Train and evaluate one stage; returns the result on rank 0 (None on other ranks)."""
    from pipeline.home import write_json_atomic
    from stages.evaluate import EvalSpec, evaluate
    from stages.registry import STAGE_CONFIGS, run_function
    from stages.runtime import StageContext, load_stage_rows

    # mlflow.end_run() (called by HF's callback when training ends) unsets MLFLOW_RUN_ID: keep it.
    spec.setdefault("mlflow_run_id", os.environ.get("MLFLOW_RUN_ID"))
    cfg = STAGE_CONFIGS[spec["kind"]].model_validate(spec["stage"])
    ctx = StageContext(spec=spec, output_dir=Path(spec["output_dir"]))
    started = time.time()
    result = run_function(spec["kind"])(cfg, ctx)
    if not ctx.is_main:
        return None
    result["metrics"]["train/seconds"] = time.time() - started
    result["metrics"].update(ctx.metrics)
    table = None
    if spec.get("eval") and cfg.evaluate and "model" in result["outputs"]:
        eval_spec = EvalSpec.model_validate(spec["eval"])
        rows = load_stage_rows(spec["inputs"]["eval_data"])
        eval_metrics, table = evaluate(str(ctx.output_dir / result["outputs"]["model"]), eval_spec, rows,
                                       getattr(cfg, "trust_remote_code", False))
        result["metrics"].update(eval_metrics)
        write_json_atomic(ctx.output_dir / "eval_samples.json", table)
    tags = result.pop("tags", {})
    if tags.get("posttrain.sandbox") == "unsandboxed":
        print("posttrain: WARNING: this stage ran model-written code without a sandbox (allow_unsandboxed)", flush=True)
    log_to_mlflow(result["metrics"], table, spec, result.pop("artifacts", []), result.pop("tables", {}), tags)
    write_json_atomic(ctx.output_dir / "result.json", result)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = [a for a in argv if not a.startswith("--local_rank")]  # the DeepSpeed launcher adds it
    die_with_parent()
    spec = json.loads(Path(args[0]).read_text())
    watch_flow(spec.get("flow_pid"))
    run_spec(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
