"""What one data stage's worker process costs, in this checkout against an older commit (default:
cc24d1e, before workers stopped importing transformers, torch and MLflow for stages that train
nothing), measured in one run on the same spec: a `decontaminate` stage over 512 synthetic_math
rows, checked against CHAMP and 2000 eval rows, logging to a real MLflow run.

    .venv/bin/python benchmarks/bench_worker_start.py [--baseline-ref cc24d1e] [--repeats 5]

Both sides run `python -m pipeline.worker spec.json` with the same interpreter; the baseline's code
comes from a temporary git worktree of the ref. Bare `python -c pass` is printed as the floor.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def spec_for(work: Path, run_id: str, rows_path: Path, i: int) -> Path:
    from stages.contracts import WorkerSpec

    out = work / f"out-{i}"
    out.mkdir()
    (out / "stage_config.json").write_text("{}")  # the older worker logs it as an artifact
    stage = {"name": "decontam", "kind": "decontaminate", "data": {"source": "upstream.dataset"},
             "eval_sets": [{"source": "champ", "split": "all"}, {"source": "synthetic_math", "split": "eval", "n": 2000}]}
    spec = WorkerSpec(kind="decontaminate", stage=stage, inputs={"data": {"n": None, "path": str(rows_path)}},
                      eval=None, output_dir=str(out), mlflow_run_id=run_id)
    path = work / f"spec-{i}.json"
    path.write_text(spec.model_dump_json())
    return path


def timed(cmd: list[str], cwd: Path, env: dict) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} in {cwd} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline-ref", default="cc24d1e")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import mlflow

    from data_curation.report import write_jsonl
    from data_curation.sources import load_rows

    if subprocess.run(["git", "rev-parse", "--verify", "-q", f"{args.baseline_ref}^{{commit}}"], cwd=ROOT,
                      capture_output=True).returncode != 0:
        return f"--baseline-ref {args.baseline_ref!r}: no such commit in {ROOT}"
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        work = Path(tmp)
        baseline = work / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(baseline), args.baseline_ref], cwd=ROOT, check=True)
        try:
            uri = f"sqlite:///{work / 'mlflow.db'}"
            env = {**os.environ, "POSTTRAIN_HOME": str(work / "home"), "MLFLOW_TRACKING_URI": uri}
            client = mlflow.MlflowClient(uri)
            run_id = client.create_run(client.create_experiment("bench")).info.run_id
            rows_path = work / "rows.jsonl"
            write_jsonl(rows_path, load_rows("synthetic_math", n=512))
            worker = [sys.executable, "-m", "pipeline.worker"]
            sides = {"python -c pass (floor)": lambda i: timed([sys.executable, "-c", "pass"], ROOT, env),
                     f"worker at {args.baseline_ref}": lambda i: timed([*worker, str(spec_for(work, run_id, rows_path, i))],
                                                                       baseline, env),
                     "worker, this checkout": lambda i: timed([*worker, str(spec_for(work, run_id, rows_path, i))], ROOT, env)}
            times: dict[str, list[float]] = {name: [] for name in sides}
            for r in range(args.repeats + 1):  # the first round warms the page cache and is dropped
                for j, (name, run) in enumerate(sides.items()):
                    t = run(r * len(sides) + j)
                    if r:
                        times[name].append(t)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, check=False)
            shutil.rmtree(baseline, ignore_errors=True)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    base = medians[f"worker at {args.baseline_ref}"]
    print(f"decontaminate worker, 512 rows, median of {args.repeats}:")
    for name, m in medians.items():
        print(f"  {name:<28} {m:6.2f} s   {m / base:5.2f}x of the baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
