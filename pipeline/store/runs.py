"""Run records: one JSON file per pipeline run in $POSTTRAIN_HOME/runs/, the source of `posttrain
show` and `posttrain list`. Written atomically after every stage, so a crashed run still shows how
far it got."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pipeline.store.home import home
from pipeline.store.locks import is_held, lock_path
from toolkit.core.files import write_json_atomic
from toolkit.core.stats import INTERVALS

KEY_METRICS = ("train/final_loss", "eval/accuracy", "eval/format_rate", "eval/thinking_tokens_mean")


def runs_dir() -> Path:
    return home() / "runs"


def new_run_id(recipe: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{recipe}-{int(time.time() * 1000) % 1000:03d}"


def save(record: dict) -> None:
    write_json_atomic(runs_dir() / f"{record['id']}.json", record)


def load(run_id: str) -> dict:
    return json.loads((runs_dir() / f"{run_id}.json").read_text())


def run_lock(run_id: str) -> Path:
    """Held by a run's process while its flow runs; the kernel releases it when the process dies."""
    return lock_path("runs", run_id)


def died(record: dict) -> bool:
    """Still `running` in its record, but no live process holds its run lock. (A record written
    before runs held locks has no lock file and is left as it says.)"""
    return record.get("status") == "running" and (lock := run_lock(record["id"])).exists() and not is_held(lock)


def _records() -> list[dict]:
    records = []
    for p in sorted(runs_dir().glob("*.json")):
        try:
            records.append(json.loads(p.read_text()))
        except ValueError:
            continue
    return sorted(records, key=lambda r: r.get("started", 0))


def dead_runs() -> list[dict]:
    """The records of runs whose process died before ending them (pipeline.crashed_runs closes them)."""
    return [r for r in _records() if died(r)]


def is_left_open(r: dict) -> bool:
    """An ended run whose MLflow and Prefect runs were not yet confirmed closed
    (pipeline.crashed_runs.close_left_open): one that did not complete, or a completed one that
    says so (`services_closed: false`: a service went away as it ended)."""
    return bool(r.get("mlflow_run_id")) and (r.get("services_closed") is False or (
        r.get("status") in ("failed", "interrupted", "crashed") and not r.get("services_closed")))


def left_open() -> list[dict]:
    return [r for r in _records() if is_left_open(r)]


def all_runs() -> list[dict]:
    """Every run record, oldest first; a dead run not yet closed reads as `crashed`."""
    records = _records()
    for r in records:
        if died(r):
            r["status"] = "crashed"
            for s in r["stages"]:
                s["status"] = "crashed" if s["status"] == "running" else s["status"]
    return records


def find(ref: str) -> dict:
    runs = all_runs()
    if not runs:
        raise LookupError(f"no runs yet in {runs_dir()}")
    if ref == "latest":
        return runs[-1]
    hits = [r for r in runs if r["id"] == ref or r["id"].startswith(ref) or r.get("mlflow_run_id") == ref
            or r.get("prefect_flow_run_id") == ref]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} runs match {ref!r}; use `posttrain list` to see run ids")
    return hits[0]


def format_table(record: dict) -> str:
    head = (f"run {record['id']}  recipe={record['recipe']} profile={record.get('profile')}  "
            f"status={record['status']}  mlflow={record.get('mlflow_run_id')}")
    cols = ["stage", "kind", "status", "seconds", *[k.split("/")[-1] for k in KEY_METRICS], "mlflow run",
            "logged model"]
    rows = [cols]
    for s in record["stages"]:
        m = s.get("metrics", {})
        how = " (cached)" if s.get("cached") else " (reused)" if s.get("reused") else ""
        rows.append([s["name"], s["kind"], s["status"] + how,
                     f"{s.get('duration_s', 0):.1f}", *[with_interval(m, k) for k in KEY_METRICS],
                     s.get("mlflow_run_id") or "-", s.get("logged_model_id") or "-"])
    tail = [f"MLflow, stages side by side: {record['mlflow_stages_url']}"] if record.get("mlflow_stages_url") else []
    tail += [f"registered: models:/{r['name']}/{r['version']} (alias {r['alias']}), the model of stage {s['name']}"
             for s in record["stages"] if (r := s.get("registry"))]
    return "\n".join([head, grid(rows), *tail])


def grid(rows: list[list]) -> str:
    """Rows of cells as left-aligned text columns."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


INTERVAL_SUFFIXES = ("_lo", "_hi", "_n", "_p")


def with_interval(metrics: dict, key: str, signed: bool = False) -> str:
    """`0.5 [0.28, 0.72]` when the metric has an interval, the number alone when not, `-` when absent."""
    if key not in metrics:
        return "-"
    fmt = "{:+.3g}" if signed else "{:.3g}"
    text = fmt.format(metrics[key])
    if f"{key}_lo" in metrics:
        text += f" [{fmt.format(metrics[key + '_lo'])}, {fmt.format(metrics[key + '_hi'])}]"
    return text


def held_out(metrics: dict) -> dict[str, float]:
    """A stage's held-out numbers with their intervals: the recipe's evaluation (accuracy, format,
    lengths, per mode and budget), a reward model's pairwise accuracy, a student's KL to its teacher.
    Reward internals (errors, Nones, std) and counts stay in MLflow."""
    return {k: v for k, v in metrics.items()
            if (k.startswith("eval/") and "/rewards/" not in k and k not in ("eval/n", "eval/unjudged"))
            or k.startswith("rm/pairwise_accuracy") or k == "rm/margin_mean" or k.startswith("distill/kl")}


def headline(metrics: dict) -> list[str]:
    """The held-out metrics a table shows as columns: the intervals go inside their metric's cell."""
    return [k for k in held_out(metrics) if not (k.endswith(INTERVAL_SUFFIXES) and k.rsplit("_", 1)[0] in metrics)]


def comparison(records: list[dict]) -> list[dict]:
    """One row per (run, stage) with every held-out metric and its change against the stage's input
    model (`change`; pipeline.gates), for `posttrain compare`. `paired` holds the changes measured
    prompt by prompt: delta, lo, hi, n and (0/1 scores) p, and whether the interval excludes 0."""
    rows = []
    for r in records:
        for s in r["stages"]:
            m = s.get("metrics", {})
            rows.append({"run": r["id"], "recipe": r["recipe"], "profile": r.get("profile"), "stage": s["name"],
                         "kind": s["kind"], "status": s["status"], "mlflow_run_id": s.get("mlflow_run_id"),
                         "logged_model_id": s.get("logged_model_id"), "registry": s.get("registry"),
                         "metrics": held_out(m),
                         "change": {k: v - m[f"input/{k}"] for k, v in held_out(m).items() if f"input/{k}" in m},
                         "paired": paired_changes(m)})
    return rows


def paired_changes(metrics: dict) -> dict[str, dict]:
    out = {}
    for key in metrics:
        if key.startswith("change/") and not key.endswith(INTERVAL_SUFFIXES):
            found = {k: metrics[f"{key}_{k}"] for k in ("lo", "hi", "n", "p") if f"{key}_{k}" in metrics}
            out[key.removeprefix("change/")] = {"delta": metrics[key], **found,
                                                 "significant": found.get("lo", 0) > 0 or found.get("hi", 0) < 0}
    return out


def change_cell(r: dict, key: str) -> str:
    """A paired change with its interval, `*` when the interval excludes 0; else the plain difference."""
    if (c := r.get("paired", {}).get(key)) is not None and "lo" in c:
        return f"{c['delta']:+.3g} [{c['lo']:+.3g}, {c['hi']:+.3g}]" + ("*" if c["significant"] else "")
    return f"{r['change'][key]:+.4g}" if key in r["change"] else "-"


def format_comparison(rows: list[dict]) -> str:
    keys = sorted({k for r in rows for k in headline(r["metrics"])}, key=lambda k: (k not in KEY_METRICS, k))
    several = len({r["run"] for r in rows}) > 1
    changes = [k for k in KEY_METRICS if any(k in r["change"] for r in rows)]
    head = (["run"] if several else []) + ["stage", "kind", *[k.removeprefix("eval/") for k in keys],
                                           *[f"change {k.removeprefix('eval/')}" for k in changes],
                                           "logged model", "registry"]
    table = [head] + [([r["run"]] if several else []) + [r["stage"], r["kind"],
                      *[with_interval(r["metrics"], k) for k in keys],
                      *[change_cell(r, k) for k in changes],
                      r.get("logged_model_id") or "-",
                      f"{g['name']}/{g['version']} @{g['alias']}" if (g := r.get("registry")) else "-"] for r in rows]
    note = f"\n{INTERVALS}; * the change's interval excludes 0"
    return grid(table) + note
