"""Hostile and odd input, table-driven: each case is refused at validation, quickly, with exit 2 and a
message naming the file (and line or YAML path), before any compute is spent."""

import os
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, parent_pid, run_cli

SMOKE = (REPO / "recipes" / "smoke.yaml").read_text()


def bomb() -> str:
    lines, prev = ['a: &a ["x","x","x","x","x","x","x","x","x"]'], "a"
    for name in "bcdefghij":
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    return "\n".join(lines) + "\n"


def thin_bomb() -> str:
    """30 aliases, under the alias limit, each doubling the one before: 2^31 values once expanded."""
    lines = ["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 31)]
    return "\n".join(lines) + "\n"


CASES = {  # name: (file content, or a callable making the path, expected message part)
    "name_is_a_path": (SMOKE.replace("name: smoke", "name: ../../escape"), "name: String should match pattern"),
    "name_with_a_slash": (SMOKE.replace("name: smoke", "name: a/b"), "name: String should match pattern"),
    "empty_name": (SMOKE.replace("name: smoke", 'name: ""'), "name: String should match pattern"),
    "alias_bomb": (bomb(), "aliases; a recipe has no use for that many"),
    "thin_alias_bomb": (thin_bomb(), "its aliases expand it past 1,000,000 values"),
    "recursive_alias": ("name: x\ndescription: y\nstages: &s [*s]\n", "*s refers to a value that contains it"),
    "deep_nesting": ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 64 levels deep"),
    "duplicate_keys": (SMOKE.replace("name: smoke", "name: smoke\nname: other"), "key 'name' is given twice (first at line"),
    "bool_for_a_number": (SMOKE.replace("max_steps: 100", "max_steps: true"), "max_steps is a number, not true"),
    "absurd_step_count": (SMOKE.replace("max_steps: 100", "max_steps: 1.0e+12"),
                          "max_steps: Input should be less than or equal to 10000000"),
    "binary_file": (b"name: \xff\xfe\x00 smoke\n", "not UTF-8 text (byte"),
    "too_big": ("# " + "x" * (1 << 20) + "\n" + SMOKE, "a recipe is at most 1048576 bytes"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_recipe_files_are_refused_fast_naming_the_file(case, tmp_path):
    content, message = CASES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    started = time.monotonic()
    done = run_cli("validate", str(path), "--profile", "tiny", timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr[-2000:])
    assert message in done.stderr and f"{case}.yaml" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - started < 30  # refused before any work: the bomb used to grow until MemoryError


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_what_is_not_a_regular_file_is_refused_without_reading_it(kind, tmp_path):
    path = {"device": lambda: "/dev/zero"}.get(kind, lambda: str(tmp_path / "x.yaml"))()
    if kind == "directory":
        os.mkdir(path)
    elif kind == "fifo":
        os.mkfifo(path)  # reading it would block forever
    done = run_cli("validate", path, "--profile", "tiny", timeout=60)
    assert done.returncode == 2 and "not a regular file" in done.stderr and path in done.stderr, done.stderr[-2000:]


def test_a_profile_is_a_name_never_a_path():
    done = run_cli("validate", "smoke", "--profile", "../smoke", timeout=120)
    assert done.returncode == 2 and "profile '../smoke' not found; profiles: demo, gpu, tiny" in done.stderr


def test_set_values_are_checked_like_files():
    value = "[" + ",".join(["&a [1]"] + ["*a"] * 80) + "]"
    done = run_cli("validate", "smoke", "--profile", "tiny", "--set", f"stages.polish.max_steps={value}", timeout=120)
    assert done.returncode == 2 and "--set stages.polish.max_steps" in done.stderr and "aliases" in done.stderr


def test_an_override_of_a_stage_that_shares_an_anchor_changes_that_stage_alone(tmp_path):
    from pipeline.recipe import load_recipe

    shared = "  - &sft {name: a, kind: sft, model: base, data: {source: synthetic_math, n: 8, seed: 1}}\n"
    path = tmp_path / "anchored.yaml"
    path.write_text(SMOKE[:SMOKE.index("stages:")] + "stages:\n" + shared + "  - {<<: *sft, name: b}\n")
    stages = load_recipe(str(path), "tiny", ["stages.b.data.seed=9"]).recipe.stages
    assert [s.data.seed for s in stages] == [1, 9]  # safe_load shares the anchor's `data` between both


def test_gc_refuses_a_negative_count():
    done = run_cli("gc", "--keep-runs", "-1", "--dry-run", timeout=60)
    assert done.returncode == 2 and "'-1' is not a whole number of 0 or more" in done.stderr


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    from toolkit.core.files import write_json_atomic

    path = tmp_path / "record.json"
    write_json_atomic(path, {"status": "running"})
    loop: dict = {}
    loop["self"] = loop  # not JSON: the dump fails midway
    with pytest.raises(ValueError, match="Circular reference"):
        write_json_atomic(path, loop)
    assert path.read_text() == '{\n  "status": "running"\n}' and sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_a_corrupt_published_output_is_trained_again_not_served(tmp_path, tiny_model):
    """Flipped bytes in a finished stage's weights: `posttrain verify` names the file, and the rerun
    trains that stage again (the one before it still comes from the cache)."""
    import json

    quick = ["--set", "stages.cold_start.max_steps=3", "--set", "stages.polish.max_steps=3", "--set", "eval=null"]
    home = tmp_path / "home"
    assert run_cli("run", "smoke", "--profile", "tiny", *quick, env_home=home).returncode == 0
    weights = next((home / "stages" / "smoke").glob("polish-*/model/model.safetensors"))
    with open(weights, "r+b") as f:
        f.seek(weights.stat().st_size // 2)
        chunk = f.read(64)
        f.seek(weights.stat().st_size // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))
    checked = run_cli("verify", "latest", env_home=home)
    assert checked.returncode == 1 and f"{weights} (sha256 differs" in checked.stdout, checked.stdout + checked.stderr
    again = run_cli("run", "smoke", "--profile", "tiny", *quick, env_home=home)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "its published output is corrupt, so it is trained again" in again.stdout + again.stderr
    stages = {s["name"]: s for s in json.loads(run_cli("show", "latest", "--json", env_home=home).stdout)["stages"]}
    assert stages["cold_start"]["cached"] and not (stages["polish"]["cached"] or stages["polish"]["reused"])
    assert run_cli("verify", env_home=home).returncode == 0
    assert list((home / "stages" / "smoke").glob("polish-*.corrupt-*"))  # kept aside, not deleted


@pytest.mark.parametrize("damage", ["truncated_weights", "zeroed_optimizer", "empty_optimizer", "lost_file"])
def test_a_corrupt_newest_checkpoint_is_moved_aside_and_the_one_before_resumed(damage, tmp_path, capsys):
    """Checkpoints get a checksum manifest when saved (progress_callback's on_save); resuming checks it."""
    from types import SimpleNamespace

    from stages.runtime import StageContext, last_checkpoint, progress_callback

    ctx = StageContext.local(tmp_path)
    callback = progress_callback(ctx)
    for step in (2, 4):
        ckpt = ctx.checkpoint_dir / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "model.safetensors").write_bytes(os.urandom(4096))
        (ckpt / "optimizer.pt").write_bytes(os.urandom(8192))
        (ckpt / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
        callback.on_save(None, SimpleNamespace(global_step=step, is_world_process_zero=True), None)
    newest = ctx.checkpoint_dir / "checkpoint-4"
    assert last_checkpoint(ctx) == str(newest)
    if damage == "truncated_weights":
        (newest / "model.safetensors").write_bytes((newest / "model.safetensors").read_bytes()[:100])
    elif damage == "zeroed_optimizer":
        (newest / "optimizer.pt").write_bytes(bytes(8192))
    elif damage == "empty_optimizer":
        (newest / "optimizer.pt").write_bytes(b"")
    else:
        (newest / "optimizer.pt").unlink()
    assert last_checkpoint(ctx) == str(ctx.checkpoint_dir / "checkpoint-2")
    out = capsys.readouterr().out
    assert f"checkpoint {newest} is corrupt" in out and str(newest / ("model.safetensors" if "weights" in damage
                                                                    else "optimizer.pt")) in out
    assert not newest.exists() and len(list(ctx.checkpoint_dir.glob("checkpoint-4.corrupt-*"))) == 1
    assert last_checkpoint(ctx) == str(ctx.checkpoint_dir / "checkpoint-2")  # the set-aside one is never picked again
    assert len(list(ctx.checkpoint_dir.glob("checkpoint-4.corrupt-*"))) == 1  # nor moved again


def test_runs_left_open_in_mlflow_by_a_failed_run_are_closed_by_the_next_one(tmp_path, monkeypatch):
    """A run that failed while the tracking server was down leaves its MLflow runs RUNNING; the next
    run (or `posttrain ui`) ends them, once, and a store still down is tried again later."""
    from pipeline.crashed_runs import close_left_open
    from pipeline.store import runs
    from pipeline.tracking import mlflow_runs

    monkeypatch.setenv("POSTTRAIN_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = mlflow_runs.start_pipeline_run("smoke", "tiny", [], "smoke-left-open")
    child = mlflow_runs.start_stage_run(parent, "smoke", "cold_start", "sft", {}, "key")
    record = {"id": "smoke-left-open", "recipe": "smoke", "status": "failed", "mlflow_run_id": parent,
              "stages": [{"name": "cold_start", "status": "failed"}]}
    runs.save(record)
    monkeypatch.setattr(mlflow_runs, "client", lambda: (_ for _ in ()).throw(ConnectionError("server down")))
    assert close_left_open(lambda line: None) == [] and not runs.load(record["id"]).get("services_closed")
    monkeypatch.undo()
    monkeypatch.setenv("POSTTRAIN_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert close_left_open(lambda line: None) == [record["id"]]
    c = mlflow_runs.client()
    assert {c.get_run(r).info.status for r in (parent, child)} == {"FAILED"}
    assert runs.load(record["id"])["services_closed"] and close_left_open(lambda line: None) == []


def test_step_metrics_are_spooled_while_the_tracking_server_is_down_and_replayed(tmp_path, monkeypatch):
    """Training never waits on MLflow: a server that does not answer costs one failed call, the
    steps go to a spool, and the flow logs them into the run afterwards."""
    from types import SimpleNamespace

    from pipeline.launch.processes import free_port
    from pipeline.tracking import mlflow_runs

    port = free_port()  # a port nobody listens on: the server is down
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    spool = tmp_path / mlflow_runs.SPOOL
    logger = mlflow_runs.step_logger("run-id", spool)
    started = time.time()
    for step in range(1, 6):
        logger.on_log(None, SimpleNamespace(is_world_process_zero=True, global_step=step), None,
                      logs={"loss": 1.0 / step, "note": "text is not a metric"})
    assert time.time() - started < 30 and len(spool.read_text().splitlines()) == 5

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")  # the server is back
    parent = mlflow_runs.start_pipeline_run("smoke", "tiny", [], "spooled")
    assert mlflow_runs.replay_spool(parent, spool) == 5 and not spool.exists()
    history = mlflow_runs.client().get_metric_history(parent, "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 1.0 / s) for s in range(1, 6)]


def test_posttrain_ui_says_which_server_died_and_exits(tmp_path):
    import signal
    import subprocess
    import urllib.request

    from pipeline.launch.processes import free_port
    from tests.conftest import POSTTRAIN, cli_env

    mlflow_port = free_port()
    ui = subprocess.Popen([POSTTRAIN, "ui", "--prefect-port", str(free_port()), "--mlflow-port", str(mlflow_port)],
                          cwd=REPO, env=cli_env(tmp_path / "home"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while True:  # the MLflow UI answers
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{mlflow_port}/health", timeout=2)
                break
            except OSError:
                assert time.time() < deadline and ui.poll() is None, "posttrain ui did not come up"
                time.sleep(1)
        children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                    and parent_pid(p) == ui.pid and b"mlflow" in (p / "cmdline").read_bytes()]
        os.killpg(children[0], signal.SIGKILL)  # the MLflow UI's process group (it is a session leader)
        _, err = ui.communicate(timeout=30)
        assert ui.returncode == 1 and "the MLflow UI (pid" in err and "exited with code" in err, err[-2000:]
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGTERM)
