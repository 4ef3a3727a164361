"""MLflow bookkeeping, and with `model_store` (logged models, registry) the only module that writes
to MLflow: one parent run per pipeline run, one nested child run per stage. The flow creates and
closes the runs; the worker streams step metrics through `step_logger` (a TrainerCallback); the flow
logs the stage's output (`log_stage_output`, from the worker's result.json) and tags the published
run. Run tag names live here; logged-model tags in `model_store`.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import time
from pathlib import Path

from pipeline.store.home import home, tracking_uri
from pipeline.store.locks import held, lock_path
from pipeline.tracking.figures import budget_points, draw_bars, draw_budget_curves, figure_file
from toolkit.rewards.sandbox import SANDBOX_TAG  # noqa: F401  (the one tag a reward sets: re-exported here)

# Tag names.
KIND_TAG = "posttrain.kind"  # "pipeline" or "stage"
RECIPE_TAG = "posttrain.recipe"
STAGE_TAG = "posttrain.stage"
STAGE_KIND_TAG = "posttrain.stage_kind"
GENERATION_TAG = "posttrain.generation"  # the engines a stage sampled with: name, precision, threads
UPSTREAM_TAG = "posttrain.upstream."
CACHE_KEY_TAG = "posttrain.cache_key"
CACHED_FROM_TAG = "posttrain.cached_from"
OUTPUT_DIR_TAG = "posttrain.output_dir"
GATE_TAG = "posttrain.gate_failed"
# MLflow 3 opens an experiment in its GenAI view (traces, judges) unless told it is model training.
EXPERIMENT_KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"


def checksum_tag(output: str) -> str:
    return f"posttrain.{output}_sha256"


_SCHEMA_READY: set[str] = set()


def client():
    """The MLflow client. The first use of a SQLite store in a process creates or checks its schema
    under a file lock: two first runs on a fresh home would otherwise race on creating the tables."""
    import mlflow

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    c = mlflow.MlflowClient(uri)
    if uri.startswith("sqlite") and uri not in _SCHEMA_READY:
        with held(lock_path("mlflow-schema")):
            c.search_experiments(max_results=1)
        _SCHEMA_READY.add(uri)
    return c


# MLflow 3's UI opens in its GenAI view (traces, judges) unless the URL or the browser says
# otherwise; a training user wants the runs table. The experiment kind tag, `workflowType` in every
# link, and a shared view (MLflow's "share view" state, kept as an experiment tag) whose columns
# compare the nested stage runs at a glance.
VIEW_KEY = "posttrain"
VIEW_COLUMNS = [f"tags.`{STAGE_KIND_TAG}`", "metrics.`eval/accuracy`", "metrics.`eval/accuracy_lo`",
                "metrics.`eval/accuracy_hi`", "metrics.`change/eval/accuracy`", "metrics.`eval/format_rate`",
                "metrics.`eval/thinking_tokens_mean`", "metrics.`rm/pairwise_accuracy`"]
VIEW_TAG = "mlflow.sharedViewState."


def _view_state(search: str = "", oldest_first: bool = False, order_by: str = "attributes.start_time") -> str:
    return json.dumps({"selectedColumns": VIEW_COLUMNS, "orderByKey": order_by,
                       "orderByAsc": oldest_first, "searchFilter": search})


EXPERIMENT_TAGS = {EXPERIMENT_KIND_TAG: TRAINING_KIND, VIEW_TAG + VIEW_KEY: _view_state()}


def is_server() -> bool:
    """Whether MLflow is a tracking server (http/https) rather than a store on this disk."""
    return tracking_uri().startswith(("http://", "https://"))


def artifact_root(experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: under POSTTRAIN_HOME for a local store (MLflow's
    default, ./mlruns, depends on the directory a run starts in); a server decides for itself."""
    return None if is_server() else (home() / "mlartifacts" / experiment.replace("/", "-")).as_uri()


def experiment_id(recipe: str) -> str:
    c = client()
    name = f"posttrain/{recipe}"
    exp = c.get_experiment_by_name(name)
    if exp is None:
        return c.create_experiment(name, artifact_location=artifact_root(name), tags=EXPERIMENT_TAGS)
    for key, value in EXPERIMENT_TAGS.items():  # made by an older posttrain
        if exp.tags.get(key) != value:
            c.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


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
                       tags={KIND_TAG: "pipeline", RECIPE_TAG: recipe})
    log_params(run.info.run_id, {"recipe": recipe, "profile": str(profile), "overrides": " ".join(overrides) or "-",
                                 "git_commit": git_commit()})
    return run.info.run_id


def start_stage_run(parent_id: str, recipe: str, stage_name: str, kind: str, config: dict,
                    cache_key: str, cached_from: str | None = None, lineage: dict | None = None) -> str:
    tags = {"mlflow.parentRunId": parent_id, KIND_TAG: "stage", STAGE_TAG: stage_name, STAGE_KIND_TAG: kind,
            CACHE_KEY_TAG: cache_key}
    if cached_from:
        tags[CACHED_FROM_TAG] = cached_from
    run = client().create_run(experiment_id(recipe), run_name=stage_name, tags=tags)
    # Prefixed so they never clash with the TrainingArguments params HF's callback logs.
    log_params(run.info.run_id, flatten(config, "stage."))
    log_lineage(run.info.run_id, lineage or {})
    return run.info.run_id


def log_lineage(run_id: str, lineage: dict) -> None:
    """Datasets as the run's MLflow dataset inputs (name, source, digest, rows; context train or
    eval); for every input an upstream stage produced, tag `posttrain.upstream.<input>` with that
    stage's MLflow run, and models as `posttrain.input.<input>`: the chain back to the sources."""
    from mlflow.entities import Dataset, DatasetInput, InputTag, RunTag

    datasets, tags = [], {}
    for field, item in lineage.items():
        if item.upstream_run:
            tags[f"{UPSTREAM_TAG}{field}"] = item.upstream_run
        if item.type == "model":
            tags[f"posttrain.input.{field}"] = f"{item.name} ({item.digest[:12]})"
            continue
        dataset = Dataset(name=item.name, digest=item.digest[:32], source_type="local", source=json.dumps(
            {"uri": item.source}), profile=json.dumps({"num_rows": item.rows}) if item.rows else None)
        datasets.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", item.context),
                                                    InputTag("posttrain.input", field)]))
    if datasets:
        client().log_inputs(run_id, datasets=datasets)
    if tags:
        client().log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])


def log_metrics(run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    import mlflow

    ts = int(time.time() * 1000)
    client().log_batch(run_id, metrics=[mlflow.entities.Metric(k, float(v), ts, step) for k, v in metrics.items()])


SPOOL = "metrics_spool.jsonl"  # step metrics the tracking server did not take, replayed by the flow
RETRY_AFTER_S = 60.0


def step_logger(run_id: str, spool: Path | None = None):
    """A TrainerCallback that logs every numeric value the trainer logs, at its global step, into
    the stage's run (rank 0 only). Replaces HF's own MLflow callback, so this module stays the
    only writer. Training never waits on the tracking server: when it does not answer, the step's
    metrics go to `spool` (one JSON line each), the server is tried again a minute later, and the
    flow replays the spool into the run when the stage ends (`replay_spool`)."""
    from transformers import TrainerCallback

    class LogSteps(TrainerCallback):
        down_since: float | None = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            numeric = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if not (state.is_world_process_zero and numeric):
                return
            if self.down_since is None or time.time() - self.down_since > RETRY_AFTER_S:
                try:
                    log_metrics(run_id, numeric, step=state.global_step)
                    self.down_since = None
                    return
                except Exception as e:  # an unreachable server, whatever the client raises for it
                    if spool is None:
                        raise
                    if self.down_since is None:
                        print(f"posttrain: the MLflow tracking server at {tracking_uri()} does not answer "
                              f"({type(e).__name__}); step metrics go to {spool} until it does", flush=True)
                    self.down_since = time.time()
            with open(spool, "a") as f:
                f.write(json.dumps({"step": state.global_step, "time": time.time(), "metrics": numeric}) + "\n")

    return LogSteps()


def replay_spool(run_id: str, spool: Path) -> int:
    """Log the spooled step metrics into the run (at their steps and times); returns how many lines.
    The spool is removed once logged, so a retry never logs a line twice."""
    import mlflow

    if not spool.exists():
        return 0
    lines = [json.loads(line) for line in spool.read_text().splitlines() if line.strip()]
    metrics = [mlflow.entities.Metric(k, float(v), int(line["time"] * 1000), line["step"])
               for line in lines for k, v in line["metrics"].items()]
    c = client()
    for start in range(0, len(metrics), 1000):  # MLflow's log_batch limit
        c.log_batch(run_id, metrics=metrics[start:start + 1000])
    spool.unlink()
    return len(lines)


def log_stage_output(run_id: str, output_dir: Path, output, table: list[dict] | None) -> None:
    """A finished stage's metrics and tags, the eval samples table, its resolved config, its own
    artifacts (files in its output dir) and tables, and the tokenizer files."""
    import mlflow

    c = client()
    ts = int(time.time() * 1000)
    c.log_batch(run_id, metrics=[mlflow.entities.Metric(k, float(v), ts, 0) for k, v in output.metrics.items()],
                tags=[mlflow.entities.RunTag(k, str(v)) for k, v in output.tags.items()])
    if table:
        c.log_table(run_id, data={k: [str(r[k]) for r in table] for k in table[0]}, artifact_file="eval_samples.json")
    c.log_artifact(run_id, str(output_dir / "stage_config.json"))
    for name in output.artifacts:
        if (output_dir / name).is_dir():
            c.log_artifacts(run_id, str(output_dir / name), artifact_path=name)
        else:
            c.log_artifact(run_id, str(output_dir / name))
    for name, columns in output.tables.items():
        c.log_table(run_id, data=columns, artifact_file=name)
    for p in (output_dir / "model").glob("*"):
        if p.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            c.log_artifact(run_id, str(p), artifact_path="tokenizer")


def tag_published(run_id: str, output_dir: str, fingerprints: dict[str, str]) -> None:
    """Weights stay on disk; the run records where, and their checksums, instead of a copy."""
    c = client()
    c.set_tag(run_id, OUTPUT_DIR_TAG, output_dir)
    for name, digest in fingerprints.items():
        c.set_tag(run_id, checksum_tag(name), digest)


def tag_gate(run_id: str, failure: str) -> None:
    client().set_tag(run_id, GATE_TAG, failure)


def end_run(run_id: str, ok: bool) -> None:
    client().set_terminated(run_id, "FINISHED" if ok else "FAILED")


def ui_url() -> str:
    """The MLflow UI links point at: POSTTRAIN_MLFLOW_UI, else the one `posttrain ui` runs for this
    home, else MLflow's default port on localhost."""
    if url := os.environ.get("POSTTRAIN_MLFLOW_UI"):
        return url
    from pipeline.store.home import server_record

    try:
        return json.loads(server_record().read_text())["mlflow_ui"]
    except (OSError, ValueError, KeyError):
        return "http://127.0.0.1:5000"


@functools.lru_cache(maxsize=1024)
def experiment_of(run_id: str) -> str:  # a run never changes experiment: one lookup per run
    return client().get_run(run_id).info.experiment_id


def run_url(run_id: str) -> str:
    return f"{ui_url()}/#/experiments/{experiment_of(run_id)}/runs/{run_id}?workflowType=machine_learning"


def experiment_url(experiment: str, view: str = VIEW_KEY) -> str:
    """The experiment's runs table with posttrain's columns (the stage comparison view)."""
    return f"{ui_url()}/#/experiments/{experiment}/runs?workflowType=machine_learning&viewStateShareKey={view}"


def stages_view_url(parent_id: str) -> str:
    """The runs table showing this pipeline run's stage runs, side by side, as flat rows in the order
    they finished (the stages run one after another). A shared view cannot expand a parent row
    (MLflow leaves `runsExpanded` out of shared views), and the table nests child runs under a
    collapsed parent whenever it is sorted by start time; sorted by end time it does not nest, so
    the filter on the parent shows the stage rows themselves."""
    experiment, view = experiment_of(parent_id), f"run-{parent_id[:12]}"
    client().set_experiment_tag(experiment, VIEW_TAG + view,
                                _view_state(f"tags.mlflow.parentRunId = '{parent_id}'", oldest_first=True,
                                            order_by="attributes.end_time"))
    return experiment_url(experiment, view)


PANELS = ("eval/accuracy", "eval/format_rate", "eval/thinking_tokens_mean", "eval/mode/think/accuracy",
          "eval/mode/no_think/accuracy", "rm/pairwise_accuracy")


def log_stage_comparison(parent_id: str, stages: list[dict], table: list[dict] | None = None) -> None:
    """On the pipeline's parent run: bars of the headline held-out metrics per stage (with each
    stage's input model as a marker), accuracy against thinking budget per stage when measured,
    the compare table (`stage_comparison.json`) and every stage's metrics."""
    c = client()
    c.log_dict(parent_id, {s["name"]: s["metrics"] for s in stages}, "stage_metrics.json")
    if table:
        c.log_table(parent_id, data={k: [json.dumps(r[k]) if isinstance(r[k], dict) else r[k] for r in table]
                                     for k in table[0]}, artifact_file="stage_comparison.json")
    keys = [k for k in PANELS if any(k in s["metrics"] for s in stages)]
    if keys:
        bars = [(key, [(s["name"], s["metrics"][key], s["metrics"].get(f"input/{key}"),
                        s["metrics"].get(f"{key}_lo"), s["metrics"].get(f"{key}_hi")) for s in stages
                       if key in s["metrics"]]) for key in keys]
        c.log_artifact(parent_id, str(figure_file("stage_comparison.png", bars, draw_bars)))
    curves = {s["name"]: budget_points(s["metrics"]) for s in stages}
    curves = {name: pts for name, pts in curves.items() if len(pts) > 1}
    if curves:
        c.log_artifact(parent_id, str(figure_file("budget_curves.png", curves, draw_budget_curves)))
