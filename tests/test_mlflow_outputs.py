"""Stage outputs in MLflow, against a real `mlflow server` on localhost (SQLite backend, local
artifact root): nested stage runs and their artifacts, logged models with linked metrics, the
registry's aliases (candidate; champion only when the gate passes), a second home (another machine
sharing only the tracking server) consuming `models:/...@candidate`, a corrupted download refused,
and an upload killed midway never turning READY."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from pipeline.launch.prefect_api import healthy
from pipeline.launch.processes import free_port
from tests.conftest import POSTTRAIN, REPO, cli_env

pytestmark = pytest.mark.slow
QUICK = ["--set", "stages.cold_start.max_steps=4", "--set", "stages.polish.max_steps=4",
         # a gate that passes (polish: champion) and one that fails (cold_start, registered by name: candidate only)
         "--set", "stages.polish.gate={metric: accuracy, min_delta: -1, on_fail: warn}",
         "--set", "stages.cold_start.gate={metric: accuracy, min_delta: 1, on_fail: warn}",
         "--set", "stages.cold_start.register=smoke-cold-start"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-server")
    url = f"http://127.0.0.1:{free_port()}"
    log = (root / "server.log").open("w")  # a failing test's first question is what the server said
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
                             "--port", url.rsplit(":", 1)[1], "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--artifacts-destination", str(root / "artifacts"), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 120
    while not healthy(url):
        assert time.time() < deadline and proc.poll() is None, "mlflow server did not come up"
        time.sleep(0.5)
    yield {"url": url, "artifacts": root / "artifacts", "log": root / "server.log"}
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    log.close()


def _run(home: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**cli_env(home), "MLFLOW_TRACKING_URI": url}
    return subprocess.run([POSTTRAIN, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def smoke(server, tmp_path_factory):
    home = tmp_path_factory.mktemp("machine-a")
    done = _run(home, server["url"], "run", "smoke", "--profile", "tiny", *QUICK)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(_run(home, server["url"], "show", "latest", "--json").stdout)
    return {"home": home, "record": record, "show": _run(home, server["url"], "show", "latest").stdout}


def test_smoke_logs_one_model_per_stage_with_linked_metrics_and_a_candidate(server, smoke):
    c = mlflow.MlflowClient(server["url"])
    stages = {s["name"]: s for s in smoke["record"]["stages"]}
    for name, stage in stages.items():  # nested stage runs with their artifacts, through the server
        run = c.get_run(stage["mlflow_run_id"])
        assert run.data.tags["mlflow.parentRunId"] == smoke["record"]["mlflow_run_id"]
        assert {"stage_config.json", "eval_samples.json"} <= {a.path for a in c.list_artifacts(run.info.run_id)}
        model = c.get_logged_model(stage["logged_model_id"])
        assert str(model.status) == "READY" and model.name == name and model.source_run_id == stage["mlflow_run_id"]
        assert model.tags["posttrain.model_artifacts"] == "copy"  # the default against a server
        assert {m.key for m in model.metrics} >= {"eval/accuracy", "eval/format_rate"}
        uploaded = {f.path for f in c.list_logged_model_artifacts(model.model_id)}
        assert {"model.safetensors", "config.json", "tokenizer.json"} <= uploaded
    version = c.get_model_version_by_alias("posttrain-smoke", "candidate")
    assert version.source == f"models:/{stages['polish']['logged_model_id']}"
    assert version.tags["posttrain.stage"] == "polish" and version.tags["posttrain.profile"] == "tiny"
    assert c.get_model_version_by_alias("posttrain-smoke", "champion").version == version.version  # its gate passed
    assert stages["polish"]["registry"] == {"name": "posttrain-smoke", "version": version.version, "alias": "champion"}
    cold = c.get_model_version_by_alias("smoke-cold-start", "candidate")
    assert cold.source == f"models:/{stages['cold_start']['logged_model_id']}"
    assert "champion" not in c.get_registered_model("smoke-cold-start").aliases  # its gate failed
    assert stages["polish"]["logged_model_id"] in smoke["show"]
    assert f"models:/posttrain-smoke/{version.version} (alias champion)" in smoke["show"]


def test_another_machine_consumes_the_candidate_by_uri_bit_identical(server, smoke, tmp_path):
    recipe = tmp_path / "from_registry.yaml"
    recipe.write_text("name: from_registry\neval: null\nstages:\n  - name: merged\n    kind: merge\n"
                      "    models: ['models:/posttrain-smoke@candidate', 'models:/posttrain-smoke/1']\n"
                      "    method: linear\n    weights: [0.5, 0.5]\n")
    home = tmp_path / "machine-b"
    done = _run(home, server["url"], "run", str(recipe), "--profile", "tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    polish = next(s for s in smoke["record"]["stages"] if s["name"] == "polish")
    (fetched,) = (home / "models" / "mlflow").iterdir()  # both URIs name one model: fetched once
    assert _sha(fetched / "model.safetensors") == _sha(Path(polish["output_dir"]) / "model" / "model.safetensors")
    run = mlflow.MlflowClient(server["url"]).search_runs(
        [mlflow.MlflowClient(server["url"]).get_experiment_by_name("posttrain/from_registry").experiment_id],
        "tags.`posttrain.stage` = 'merged'")[0]
    assert run.data.tags["posttrain.input.models.0"].startswith("models:/posttrain-smoke@candidate")


def test_a_corrupted_download_is_refused(server, smoke, tmp_path, monkeypatch):
    from pipeline.tracking import logged_models

    cold = next(s for s in smoke["record"]["stages"] if s["name"] == "cold_start")
    (weights,) = server["artifacts"].rglob(f"{cold['logged_model_id']}/artifacts/model.safetensors")
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    monkeypatch.setenv("POSTTRAIN_HOME", str(tmp_path / "machine-c"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server["url"])
    with pytest.raises(ValueError, match="refused"):
        logged_models.fetch(f"models:/{cold['logged_model_id']}")
    assert not any((tmp_path / "machine-c" / "models" / "mlflow").iterdir())  # nothing half-fetched left


UPLOAD = """
import sys
from pathlib import Path
from pipeline.tracking import logged_models, mlflow_runs
run = mlflow_runs.client().create_run(mlflow_runs.experiment_id("upload_kill")).info.run_id
print(run, flush=True)
logged_models.log_model(run, "big", Path(sys.argv[1]), "0" * 64, {"eval/accuracy": 1.0}, "copy")
"""


def test_a_killed_upload_never_turns_ready_and_the_rerun_uploads_again(server, tmp_path, monkeypatch):
    from pipeline.tracking import logged_models

    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text("{}")
    (big / "model.safetensors").write_bytes(os.urandom(300 << 20))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server["url"])
    proc = subprocess.Popen([sys.executable, "-c", UPLOAD, str(big)], cwd=REPO, env={**os.environ},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    run = proc.stdout.readline().strip()
    c = mlflow.MlflowClient(server["url"])
    experiment = c.get_run(run).info.experiment_id
    deadline = time.time() + 120
    while not (pending := c.search_logged_models([experiment], filter_string=f"source_run_id = '{run}'")):
        assert time.time() < deadline and proc.poll() is None, "the upload never started"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    (model,) = pending
    assert str(c.get_logged_model(model.model_id).status) == "PENDING"
    with pytest.raises(ValueError, match="not READY"):
        logged_models.fetch(f"models:/{model.model_id}")
    try:
        rerun = logged_models.ensure_logged_model(run, run, "big", big, "0" * 64, {}, "copy")
    except mlflow.exceptions.MlflowException as e:  # a server error says why only in the server's log
        pytest.fail(f"{e}\nthe server's log ends:\n{server['log'].read_text()[-4000:]}")
    assert rerun != model.model_id and str(c.get_logged_model(rerun).status) == "READY"


def test_posttrain_eval_takes_a_stage_output_a_directory_and_a_models_uri(server, smoke):
    """The same model named three ways: one measurement (cached by content), a paired change of 0."""
    polish = next(s for s in smoke["record"]["stages"] if s["name"] == "polish")
    directory = str(Path(polish["output_dir"]) / "model")
    done = _run(smoke["home"], server["url"], "eval", f"{smoke['record']['id']}/polish", directory,
                "models:/posttrain-smoke@candidate", "--data", "synthetic_math:eval", "--n", "8", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    models = report["models"]
    assert [m["cached"] for m in models[:2]] == [False, True] and models[0]["fingerprint"] == models[1]["fingerprint"]
    for m in models:
        assert {"eval/accuracy", "eval/accuracy_lo", "eval/accuracy_hi", "eval/accuracy_n"} <= set(m["metrics"])
        assert m["metrics"]["eval/accuracy_n"] == 8
        run = mlflow.MlflowClient(server["url"]).get_run(m["mlflow_run_id"])
        assert run.data.metrics["eval/accuracy_lo"] == m["metrics"]["eval/accuracy_lo"]
    assert models[2]["metrics"]["eval/accuracy"] == models[0]["metrics"]["eval/accuracy"]
    assert [p["accuracy"]["delta"] for p in report["paired"]] == [0.0, 0.0]
    assert all(not p["accuracy"]["significant"] and p["accuracy"]["n"] == 8 for p in report["paired"])
    table = _run(smoke["home"], server["url"], "eval", "polish@latest", "--data", "synthetic_math:eval", "--n", "8")
    assert table.returncode == 0 and "[" in table.stdout and "cached" in table.stdout, table.stderr[-2000:]
    refused = _run(smoke["home"], server["url"], "eval", "nosuchstage@latest", "--data", "synthetic_math:eval")
    assert refused.returncode == 2 and "no completed run has a stage 'nosuchstage'" in refused.stderr
