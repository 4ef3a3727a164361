"""Crashes leave nothing behind and concurrent runs are safe: SIGKILL of `posttrain run` takes its
workers and its temporary Prefect API with it; Ctrl-C stops a run in seconds; a tracking server
killed mid-stage costs no training; two recipes sharing stages, run at once on a fresh home, publish
each stage once; a lock whose holder died never blocks; the next run closes a dead run in its record,
MLflow and Prefect; `posttrain gc` frees what no kept run needs."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import POSTTRAIN, REPO, cli_env, paused_once_training, run_cli, wait_for

pytestmark = pytest.mark.slow
QUICK = ["--set", "stages.cold_start.max_steps=3", "--set", "stages.polish.max_steps=3", "--set", "eval=null"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _members(pgid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(p.name))
    return out


def test_sigkill_of_the_run_leaves_no_process_and_the_rerun_resumes(tmp_path, tiny_model):
    home = tmp_path / "home"
    args = ["run", "smoke", "--profile", "tiny", "--set", "stages.cold_start.max_steps=40",
            "--set", "stages.cold_start.save_steps=5", "--set", "eval=null"]
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([POSTTRAIN, *args], cwd=REPO, env=cli_env(home), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    stage = wait_for(lambda: next((home / "stages" / "smoke").glob("cold_start-*.partial"), None)
                     if (home / "stages" / "smoke").exists() else None, 240, "the stage to start")
    wait_for(lambda: sorted((stage / "checkpoints").glob("checkpoint-*/trainer_state.json")), 300, "a checkpoint")
    worker = int((stage / "worker.pid").read_text())
    server = int(re.search(r"temporary Prefect API \S+ \(pid (\d+)", log.read_text()).group(1))
    assert _alive(worker) and _alive(server)
    proc.send_signal(signal.SIGKILL)  # the run's process alone, as the OOM killer would
    proc.wait()
    wait_for(lambda: not (_members(proc.pid) or _members(worker) or _alive(worker) or _alive(server)), 30,
             "every process of the run to end")

    dead = json.loads(run_cli("show", "latest", "--json", env_home=home).stdout)
    assert dead["status"] == "crashed" and dead["stages"][0]["status"] == "crashed"  # not "running" forever

    rerun = run_cli(*args, env_home=home, timeout=600)  # the dead run's stage lock does not block it
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert f"run {dead['id']} had died without ending" in rerun.stdout + rerun.stderr
    record = json.loads(run_cli("show", "latest", "--json", env_home=home).stdout)
    assert record["stages"][0]["metrics"]["train/resumed_from_step"] >= 5
    assert record["stages"][0]["metrics"]["train/global_step"] == 40
    # The rerun closed the dead run everywhere: its record, MLflow (pipeline and stage run), Prefect.
    closed = json.loads((home / "runs" / f"{dead['id']}.json").read_text())
    assert closed["status"] == "crashed" and closed["stages"][0]["status"] == "crashed"
    import mlflow

    store = mlflow.MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    parent = store.get_run(dead["mlflow_run_id"])
    stage_runs = store.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert parent.info.status == "KILLED" and [r.info.status for r in stage_runs] == ["KILLED"]
    with sqlite3.connect(home / "prefect" / "prefect.db") as db:
        (state,) = db.execute("SELECT state_type FROM flow_run WHERE id = ?", (dead["prefect_flow_run_id"],)).fetchone()
        tasks = db.execute("SELECT state_type FROM task_run WHERE flow_run_id = ?", (dead["prefect_flow_run_id"],))
        assert state == "CRASHED" and [t for (t,) in tasks] == ["CRASHED"]


def test_ctrl_c_stops_the_run_in_seconds_records_it_interrupted_and_the_rerun_resumes(tmp_path, tiny_model):
    """Ctrl-C in a terminal is SIGINT to the whole foreground process group."""
    home = tmp_path / "home"
    args = ["run", "smoke", "--profile", "tiny", "--set", "stages.cold_start.max_steps=200",
            "--set", "stages.cold_start.save_steps=5", "--set", "eval=null"]
    with open(tmp_path / "run.log", "w") as out:
        proc = subprocess.Popen([POSTTRAIN, *args], cwd=REPO, env=cli_env(home), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    stage = wait_for(lambda: next((home / "stages" / "smoke").glob("cold_start-*.partial"), None)
                     if (home / "stages" / "smoke").exists() else None, 240, "the stage to start")
    wait_for(lambda: sorted((stage / "checkpoints").glob("checkpoint-*/checksums.json")), 300, "a checkpoint")
    worker = int((stage / "worker.pid").read_text())
    started = time.time()
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 130 and time.time() - started < 10, (tmp_path / "run.log").read_text()[-3000:]
    wait_for(lambda: not _alive(worker), 10, "the worker to stop")
    record = json.loads(run_cli("show", "latest", "--json", env_home=home).stdout)
    assert record["status"] == "interrupted" and record["stages"][0]["status"] == "interrupted"
    rerun = run_cli(*args, env_home=home, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert json.loads(run_cli("show", "latest", "--json", env_home=home).stdout)["stages"][0]["metrics"][
        "train/resumed_from_step"] >= 5


def test_two_recipes_sharing_stages_run_at_once_on_a_fresh_home_publish_each_stage_once(tmp_path, tiny_model):
    """`smoke` and a copy under another name, at once: their stages are identical (same cache key),
    so one lock per key across recipes lets one train each stage while the other waits and takes it;
    one published directory and one MLflow logged model per output."""
    from transformers import AutoModelForCausalLM

    home = tmp_path / "home"
    twin = tmp_path / "smoke_twin.yaml"
    twin.write_text((REPO / "recipes" / "smoke.yaml").read_text().replace("name: smoke", "name: smoke_twin", 1))
    procs = [subprocess.Popen([POSTTRAIN, "run", recipe, "--profile", "tiny", *QUICK], cwd=REPO,
                              env=cli_env(home, seeded=False),  # both set up the new home at once
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for recipe in ("smoke", str(twin))]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert not list((home / "stages").glob("*/*.partial"))
    for name in ("cold_start", "polish"):
        (published,) = (home / "stages").glob(f"*/{name}-*")  # under whichever recipe trained it
        assert json.loads((published / "result.json").read_text())["name"] == name
        AutoModelForCausalLM.from_pretrained(published / "model")  # whole, loadable weights
    records = [json.loads(p.read_text()) for p in (home / "runs").glob("*.json")]
    assert sorted(r["recipe"] for r in records) == ["smoke", "smoke_twin"]
    for i in range(2):  # each stage trained by exactly one run; the other took the published result
        trained = [r for r in records if not r["stages"][i].get("reused")]
        assert len(trained) == 1 and all(r["stages"][i]["status"] == "completed" for r in records)
        assert len({r["stages"][i]["logged_model_id"] for r in records}) == 1  # one MLflow model per output


def test_a_lock_whose_holder_was_killed_never_blocks(tmp_path):
    from pipeline.store.locks import held, is_held

    path = tmp_path / "stage.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from pipeline.store.locks import held\n"
                               f"with held(Path({str(path)!r})):\n    print('held', flush=True)\n    time.sleep(600)"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert is_held(path)
    holder.kill()
    holder.wait()
    assert not is_held(path)
    started = time.time()
    with held(path) as waited:
        assert not waited and time.time() - started < 1


def test_gc_keeps_what_kept_runs_reference_and_what_live_runs_hold(tmp_path, tiny_model, monkeypatch):
    from pipeline.store.locks import held, stage_lock

    home = tmp_path / "home"
    for steps in (3, 4, 5):  # three runs of different settings: cold_start is shared, polish differs
        proc = run_cli("run", "smoke", "--profile", "tiny", *QUICK, "--set", f"stages.polish.max_steps={steps}",
                       env_home=home, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    stages = home / "stages" / "smoke"
    before = sorted(p.name for p in stages.iterdir())
    assert len(before) == 4  # one cold_start, three polish
    dry = run_cli("gc", "--keep-runs", "1", "--dry-run", env_home=home)
    assert dry.returncode == 0 and "would remove 2 stage directories" in dry.stdout, dry.stdout
    assert sorted(p.name for p in stages.iterdir()) == before  # a dry run removes nothing
    monkeypatch.setenv("POSTTRAIN_HOME", str(home))
    from pipeline.store import runs

    oldest = runs.all_runs()[0]
    with held(runs.run_lock(oldest["id"])):  # as if the oldest run were still going: its record and stages stay
        live = run_cli("gc", "--keep-runs", "1", "--dry-run", env_home=home)
    assert "would remove 1 stage directories" in live.stdout and oldest["id"] not in live.stdout, live.stdout
    newest = json.loads(run_cli("show", "latest", "--json", env_home=home).stdout)
    kept = {Path(s["output_dir"]).name for s in newest["stages"]}
    busy, free = [name for name in before if name not in kept]
    with held(stage_lock(busy)):  # as a live run training that stage would
        gc = run_cli("gc", "--keep-runs", "1", env_home=home)
    assert gc.returncode == 0 and f"removed {stages / free}" in gc.stdout and "a live run holds its lock" in gc.stdout
    assert sorted(p.name for p in stages.iterdir()) == sorted(kept | {busy})
    assert len(list((home / "runs").glob("*.json"))) == 1


def _mlflow_server(tmp_path: Path, port: int) -> subprocess.Popen:
    """A real tracking server on loopback, with its own store (restarted on the same one)."""
    log = (tmp_path / "mlflow-server.log").open("ab")
    return subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
                             "--artifacts-destination", str(tmp_path / "server-artifacts")],
                            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_a_tracking_server_killed_mid_stage_costs_no_training_and_its_runs_are_closed_later(tmp_path, tiny_model):
    """The stage trains on with its step metrics spooled, is published, and the run fails naming the
    tracking server. With the server back, the rerun takes the published stage (no retraining),
    replays the spool into the run that trained it, and ends the first run's MLflow runs FAILED."""
    import mlflow

    from pipeline.launch.prefect_api import healthy
    from pipeline.launch.processes import free_port
    from pipeline.tracking import mlflow_runs

    home, port = tmp_path / "home", free_port()
    uri = f"http://127.0.0.1:{port}"
    env = {**cli_env(home), "MLFLOW_TRACKING_URI": uri}
    args = ["run", "smoke", "--profile", "tiny", "--set", "stages.cold_start.max_steps=100",
            "--set", "stages.cold_start.save_steps=1000", "--set", "eval=null"]
    server = _mlflow_server(tmp_path, port)
    try:
        wait_for(lambda: healthy(uri), 120, "the tracking server")
        log = tmp_path / "run.log"
        launched = time.time()
        with open(log, "w") as out:
            run = subprocess.Popen([POSTTRAIN, *args], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        # the server dies while the stage has most of its steps to go
        with paused_once_training(home / "stages" / "smoke", "cold_start", launched, run, log) as partial:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        assert run.wait(timeout=600) == 1
        out = log.read_text()
        assert f"the MLflow tracking server at {uri} does not answer" in out, out[-3000:]
        published = partial.with_suffix("")
        assert json.loads((published / "result.json").read_text())["metrics"]["train/global_step"] == 100
        spooled = [json.loads(line)["step"] for line in (published / mlflow_runs.SPOOL).read_text().splitlines()]
        first = json.loads(run_cli("show", "latest", "--json", env_home=home).stdout)
        assert first["status"] == "failed" and spooled

        server = _mlflow_server(tmp_path, port)
        wait_for(lambda: healthy(uri), 120, "the tracking server, back")
        rerun = subprocess.run([POSTTRAIN, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
        second = json.loads(run_cli("show", "latest", "--json", env_home=home).stdout)
        assert second["stages"][0]["reused"] and second["stages"][0]["output_dir"] == str(published)
        assert not (published / mlflow_runs.SPOOL).exists()
        c = mlflow.MlflowClient(uri)
        trained = json.loads((published / "result.json").read_text())["mlflow_run_id"]  # the stage's own run
        assert {m.step for m in c.get_metric_history(trained, "loss")} >= set(spooled)
        assert c.get_run(first["mlflow_run_id"]).info.status == "FAILED" and c.get_run(trained).info.status == "FAILED"
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
