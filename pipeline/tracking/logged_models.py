"""Stage outputs in MLflow: every model a stage publishes becomes an MLflow 3 logged model, linked to
its stage run, with the stage's held-out metrics linked to it (the experiment's Models tab lists and
compares every stage's output); every dataset it publishes becomes an MLflow dataset of its run; a
recipe's final stage registers its model; and a recipe can name a
model by MLflow URI (`models:/name@alias`, `models:/name/3`, `models:/m-<id>`, `runs:/<run>/model`),
fetched once into a content-addressed cache and checked against the recorded checksum.

Two ways to keep the weights (`mlflow_runs.model_artifacts` in the recipe or profile):
- `copy` uploads the model directory (safetensors, tokenizer, chat template) to the artifact store,
  so a machine that shares only the tracking server can use it. The default for an http(s) server.
- `reference` records the published directory and its checksum, without a copy (the default for a
  local store: the weights are already on this disk; a second copy would only double them).
A logged model turns READY only after its upload finished; one killed mid-upload stays PENDING and is
never fetched, and the rerun logs a new one.

With `tracking`, the only module that writes to MLflow.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from pipeline.store.home import home
from pipeline.tracking import mlflow_runs
from toolkit.core.files import dir_fingerprint, write_json_atomic

CANDIDATE_REFUSED_TAG = "posttrain.candidate_refused"  # on a version: why `candidate` stayed where it was
MODEL_ID_TAG = "posttrain.logged_model_id"  # on a stage run: the logged model of its output
SHA_TAG = "posttrain.sha256"  # on a logged model: dir_fingerprint of its weights
MODE_TAG = "posttrain.model_artifacts"  # copy | reference
CANDIDATE, CHAMPION = "candidate", "champion"
LINKED_METRICS = ("eval/", "rm/", "before/", "teacher/", "distill/")
URI_PREFIXES = ("models:/", "runs:/")


def is_uri(ref: str) -> bool:
    return ref.startswith(URI_PREFIXES)


def default_mode() -> str:
    return "copy" if mlflow_runs.is_server() else "reference"



def log_model(run_id: str, name: str, model_dir: Path, sha256: str, metrics: dict[str, float], mode: str) -> str:
    """A READY logged model for `model_dir`, sourced from `run_id`, with the held-out metrics linked."""
    from mlflow.entities import Metric

    c = mlflow_runs.client()
    model = c.create_logged_model(mlflow_runs.experiment_of(run_id), name=name, source_run_id=run_id,
                                  model_type="transformers",
                                  tags={SHA_TAG: sha256, MODE_TAG: mode, mlflow_runs.OUTPUT_DIR_TAG: str(model_dir)})
    try:
        if mode == "copy":
            _upload(model, model_dir)
        ts = int(time.time() * 1000)
        linked = [Metric(k, float(v), ts, 0, model_id=model.model_id) for k, v in metrics.items()
                  if k.startswith(LINKED_METRICS)]
        if linked:
            c.log_batch(run_id, metrics=linked)
    except Exception:
        c.finalize_logged_model(model.model_id, "FAILED")  # a SIGKILL skips this: the model stays PENDING
        raise
    c.finalize_logged_model(model.model_id, "READY")
    c.set_tag(run_id, MODEL_ID_TAG, model.model_id)
    return model.model_id


def _upload(model, model_dir: Path) -> None:
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from tqdm import tqdm

    repo = get_artifact_repository(model.artifact_location, tracking_uri=mlflow_runs.tracking_uri())
    files = sorted(p for p in model_dir.rglob("*") if p.is_file())
    with tqdm(total=sum(p.stat().st_size for p in files), unit="B", unit_scale=True,
              desc=f"uploading {model.name}", mininterval=2) as bar:
        for path in files:
            parent = path.parent.relative_to(model_dir)
            repo.log_artifact(str(path), None if parent == Path(".") else parent.as_posix())
            bar.update(path.stat().st_size)


def ensure_logged_model(producing_run: str | None, run_id: str, name: str, model_dir: Path, sha256: str,
                        metrics: dict[str, float], mode: str) -> str:
    """The logged model of a stage output: the one its producing run is tagged with (whichever run
    logged it), or a new one sourced from `run_id` when none finished; the caller holds the output's
    model lock (pipeline.store.locks.model_lock), so a second caller finds the first one's model."""
    from mlflow.exceptions import MlflowException

    c = mlflow_runs.client()
    try:
        model_id = c.get_run(producing_run).data.tags.get(MODEL_ID_TAG) if producing_run else None
        ready = bool(model_id) and str(c.get_logged_model(model_id).status) == "READY"
    except MlflowException:  # the producing run is in another store
        model_id, ready = None, False
    if ready:
        if run_id != producing_run:
            c.set_tag(run_id, MODEL_ID_TAG, model_id)
        return model_id
    model_id = log_model(run_id, name, model_dir, sha256, metrics, mode)
    if producing_run and producing_run != run_id:  # so the run that trained it finds this one
        with contextlib.suppress(MlflowException):
            c.set_tag(producing_run, MODEL_ID_TAG, model_id)
    return model_id


def log_datasets(run_id: str, stage: str, output_dir: Path, outputs: dict[str, str], fingerprints: dict[str, str],
                 mode: str) -> None:
    """Every JSONL a stage produced (a curated `dataset`, preference `pairs`) as an MLflow dataset of
    its run (context `output`: name `<stage>.<output>`, source, digest, columns, rows) and, with
    `copy`, as an artifact under `outputs/`."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    c = mlflow_runs.client()
    logged = []
    for name, rel in outputs.items():
        path = output_dir / rel
        if name == "model" or path.suffix != ".jsonl" or not path.is_file():
            continue
        rows, columns = 0, []
        with path.open() as f:
            for line in f:
                if line.strip():
                    columns = columns or list(json.loads(line))
                    rows += 1
        schema = {"mlflow_colspec": [{"name": k, "type": "string"} for k in columns]}
        dataset = Dataset(name=f"{stage}.{name}", digest=fingerprints[name][:32], source_type="local",
                          source=json.dumps({"uri": str(path)}), schema=json.dumps(schema),
                          profile=json.dumps({"num_rows": rows}))
        logged.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "output")]))
        if mode == "copy":
            c.log_artifact(run_id, str(path), artifact_path="outputs")
    mixture = output_dir / "mixture.json"
    if mixture.is_file():  # the rows a mixture actually used, per part: the realised ratio
        parts = json.loads(mixture.read_text())
        profile = {"num_rows": sum(p["used"] for p in parts), "parts": [[p["part"], p["used"]] for p in parts]}
        dataset = Dataset(name=f"{stage}.mixture", digest=hashlib.sha256(mixture.read_bytes()).hexdigest()[:32],
                          source_type="local", source=json.dumps({"uri": str(mixture)}), profile=json.dumps(profile))
        logged.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "training")]))
    if logged:
        c.log_inputs(run_id, datasets=logged)


def candidate_output_dir(name: str) -> Path | None:
    """Where the current `candidate` version of `name` was published (None: no candidate yet, or
    its run is in another store or never recorded a directory)."""
    from mlflow.exceptions import MlflowException

    c = mlflow_runs.client()
    try:
        version = c.get_model_version_by_alias(name, CANDIDATE)
        out = c.get_run(version.run_id).data.tags.get(mlflow_runs.OUTPUT_DIR_TAG) if version.run_id else None
    except MlflowException:
        return None
    return Path(out) if out else None


def register(model_id: str, name: str, run_id: str, tags: dict[str, str], refused: str | None = None) -> str:
    """The registry version of `model_id` under `name` (made once), with alias `candidate` unless
    `refused` says why it must not replace the current one (recorded as a tag on the version)."""
    from mlflow.exceptions import MlflowException

    c = mlflow_runs.client()
    try:
        c.create_registered_model(name, description="posttrain: a recipe's final model, one version per trained output")
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    found = c.search_model_versions(f"name = '{name}' and tags.`{MODEL_ID_TAG}` = '{model_id}'")
    version = found[0].version if found else c.create_model_version(
        name, source=f"models:/{model_id}", run_id=run_id, tags={**tags, MODEL_ID_TAG: model_id},
        model_id=model_id).version
    if refused:
        c.set_model_version_tag(name, str(version), CANDIDATE_REFUSED_TAG, refused)
    else:
        c.set_registered_model_alias(name, CANDIDATE, str(version))
    return str(version)


def promote(name: str, version: str) -> None:
    mlflow_runs.client().set_registered_model_alias(name, CHAMPION, version)


def logged_model_of(uri: str):
    """The LoggedModel a `models:/` or `runs:/<run>/model` URI names; ValueError naming the URI."""
    from mlflow.exceptions import MlflowException

    c = mlflow_runs.client()
    try:
        if uri.startswith("runs:/"):
            run, _, path = uri.removeprefix("runs:/").partition("/")
            model_id = c.get_run(run).data.tags.get(MODEL_ID_TAG) if path.strip("/") == "model" else None
            if not model_id:
                raise ValueError(f"{uri}: only a stage run's `model` output can be named by runs:/ "
                                 f"(run {run} has no {MODEL_ID_TAG} tag, or the path is not `model`)")
        else:
            rest = uri.removeprefix("models:/")
            if rest.startswith("m-"):
                model_id = rest
            else:
                if "@" in rest:
                    version = c.get_model_version_by_alias(*rest.split("@", 1))
                else:
                    name, _, number = rest.rpartition("/")
                    version = c.get_model_version(name, number)
                # A SQLite store does not fill ModelVersion.model_id; the source names the model.
                model_id = version.model_id or version.source.removeprefix("models:/")
        model = c.get_logged_model(model_id)
    except MlflowException as e:
        raise ValueError(f"{uri}: not found in the MLflow store at {mlflow_runs.tracking_uri()} ({e.message})") from None
    if str(model.status) != "READY":
        raise ValueError(f"{uri}: logged model {model_id} is {model.status}, not READY (an upload that never finished)")
    if SHA_TAG not in model.tags:
        raise ValueError(f"{uri}: logged model {model_id} has no {SHA_TAG} tag; posttrain cannot verify it")
    return model


def fetch(uri: str) -> tuple[str, str]:
    """(local directory, sha256) of the model `uri` names. A copied model is downloaded once into
    $POSTTRAIN_HOME/models/mlflow/<sha256> and refused when its weights do not hash to the recorded
    checksum; a referenced one is used in place when this machine has its directory."""
    model = logged_model_of(uri)
    sha = model.tags[SHA_TAG]
    if model.tags.get(MODE_TAG) == "reference":
        path = Path(model.tags.get(mlflow_runs.OUTPUT_DIR_TAG, ""))
        if not (path / "config.json").exists():
            raise ValueError(f"{uri}: logged by reference to {path}, which this machine does not have "
                             f"(log it with mlflow_runs.model_artifacts: copy to fetch it elsewhere)")
        _check(uri, path, sha)
        return str(path), sha
    cache = home() / "models" / "mlflow" / sha[:32]
    if (cache / "posttrain_fetched.json").exists():
        return str(cache), sha
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache.parent, prefix=f".{sha[:12]}."))
    try:
        import mlflow

        got = Path(mlflow.artifacts.download_artifacts(artifact_uri=model.artifact_location, dst_path=str(tmp),
                                                       tracking_uri=mlflow_runs.tracking_uri()))
        _check(uri, got, sha)
        write_json_atomic(got / "posttrain_fetched.json", {"uri": uri, "model_id": model.model_id, "sha256": sha})
        shutil.rmtree(cache, ignore_errors=True)  # a leftover without the marker
        os.replace(got, cache)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(cache), sha


def _check(uri: str, path: Path, sha: str) -> None:
    got = dir_fingerprint(path)
    if got != sha:
        raise ValueError(f"{uri}: the weights at {path} hash to {got[:16]}, but the logged model records {sha[:16]}; "
                         "refused (a corrupted or changed copy)")
