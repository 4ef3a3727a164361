"""Where posttrain keeps its state, and how it writes files so that a crash never leaves half of one.

POSTTRAIN_HOME (default ./.posttrain) holds:
    mlflow.db    MLflow tracking store (unless MLFLOW_TRACKING_URI says otherwise)
    prefect/     PREFECT_HOME: Prefect's database and persisted task results (the stage cache)
    models/      named models built or converted locally, and models fetched from MLflow (models/mlflow/)
    mlartifacts/ the local MLflow store's artifacts, one directory per experiment
    stages/      stage outputs, one directory per (stage name, cache key)
    runs/        one JSON record per pipeline run, for `posttrain show`
    locks/       one file lock per stage output, per running pipeline run, and per first-time store set-up
    nodes/       the multi-node rendezvous: the posted stage and each follower node's reports
    cache/       passing earnability probes (per reward-code fingerprint), drawn comparison figures,
                 and each source file's import scan (imports/, for code fingerprints)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from toolkit.core.files import write_json_atomic
from toolkit.core.fingerprints import keep_import_scans_in
from toolkit.rollouts.engines import keep_conversions_in


def home() -> Path:
    return Path(os.environ.get("POSTTRAIN_HOME", ".posttrain")).resolve()


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or home_settings(home())["MLFLOW_TRACKING_URI"]


def home_settings(root: Path) -> dict[str, str]:
    """Where Prefect and MLflow keep their state for the home `root` (Prefect's persisted task
    results are the stage cache)."""
    return {"PREFECT_HOME": str(root / "prefect"), "PREFECT_LOCAL_STORAGE_PATH": str(root / "prefect" / "storage"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}


def configure_environment() -> None:
    """Point Prefect and MLflow at POSTTRAIN_HOME unless the user has pointed them elsewhere."""
    root = home()
    root.mkdir(parents=True, exist_ok=True)
    keep_import_scans_in(root / "cache" / "imports")
    keep_conversions_in(root / "cache")  # one generation-engine conversion per model
    for name, value in home_settings(root).items():
        os.environ.setdefault(name, value)
    # A tracking server that does not answer is known in seconds, not after MLflow's default of
    # seven retries with backoff; training spools its step metrics meanwhile (tracking.step_logger)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    # Likewise Prefect: two retries (2 s, 4 s) instead of five (about a minute of backoff per call)
    # before a run says its Prefect API went away; finished stages are published either way.
    os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "2")
    # Stage results are what the cache stores; they are kept in the home (home_settings).
    os.environ.setdefault("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "true")
    # Never reach a model hub by surprise: a hub id must already be in the local cache (validation
    # checks it). Export HF_HUB_OFFLINE=0 to let a run download (the gpu profile's first run).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Telemetry writes race with the ephemeral server's own start-up on SQLite ("database is locked").
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")


def publish_dir(partial: Path, final: Path) -> None:
    """Move a finished directory into place. `final` either appears whole or not at all."""
    if final.exists():  # an identical stage finished meanwhile (same cache key): keep the older one
        shutil.rmtree(partial)
        return
    os.replace(partial, final)


def server_record() -> Path:
    """Where `posttrain ui` records its servers' addresses, so runs, `serve` and MLflow links find them."""
    return home() / "prefect" / "server.json"


def write_server_record(api_url: str, pid: int, mlflow_ui: str) -> None:
    write_json_atomic(server_record(), {"api_url": api_url, "pid": pid, "mlflow_ui": mlflow_ui})
