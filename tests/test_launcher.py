"""The real launch paths: DeepSpeed with 2 ranks on CPU, failure reporting, kill on cancel, resume."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.launch.workers import StageFailed, run_worker
from stages.launch import LaunchSpec
from tests.conftest import POSTTRAIN, REPO, cli_env, run_cli, wait_for

pytestmark = pytest.mark.slow


def sft_spec(out: Path, model: str, ds_config: str | None = None, max_steps: int = 4, eval_rows: int = 0,
             **fields) -> Path:
    from stages.evaluate import EvalSpec
    from stages.sft import SFTConfig

    fields = {"save_steps": 2, "per_device_batch_size": 4, "max_length": 128, "learning_rate": 1e-3, **fields}
    cfg = SFTConfig(name="ds_check", model=model, data={"source": "synthetic_math", "n": 64}, max_steps=max_steps,
                    **fields)
    out.mkdir(parents=True)
    spec = {"kind": "sft", "stage": cfg.model_dump(mode="json"), "eval": None, "output_dir": str(out),
            "inputs": {"model": model, "data": cfg.data.model_dump()}, "deepspeed_config": ds_config}
    if eval_rows:  # rank 0 evaluates the consolidated model
        ev = EvalSpec(data={"source": "synthetic_math", "split": "eval", "n": eval_rows}, max_new_tokens=8)
        spec.update(eval=ev.model_dump(mode="json"), inputs={**spec["inputs"], "eval_data": ev.data.model_dump()})
    (out / "stage_config.json").write_text("{}")
    path = out / "spec.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize("warm", ["1", "0"], ids=["forked-ranks", "deepspeed-launcher"])
def test_sft_under_deepspeed_launcher_with_two_ranks(tmp_path, tiny_model, monkeypatch, warm):
    """Forked from the warm server on CPU; DeepSpeed's own launcher where warm workers are off (and
    on every GPU machine)."""
    monkeypatch.setenv("POSTTRAIN_WARM_WORKERS", warm)
    spec = sft_spec(tmp_path / "out", str(tiny_model), str(REPO / "infra/deepspeed/zero2.json"))
    log = tmp_path / "worker.log"
    run_worker(spec, LaunchSpec(mode="deepspeed", ranks=2), log, env={})
    text = log.read_text()
    assert "--num_gpus 2" in text and "dist_world_size=2" in text
    assert ("forked from the warm worker server" in text) == (warm == "1")
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["metrics"]["train/global_step"] == 4
    assert result["metrics"]["train/tokens"] > 4 * 4 * 2 * 10  # 4 steps x 4 rows x 2 ranks of >10 tokens
    assert result["metrics"]["train/tokens_per_second"] > 0
    assert (tmp_path / "out" / "model" / "model.safetensors").exists()


def test_failed_worker_reports_its_log_tail(tmp_path):
    broken = tmp_path / "broken_model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    spec = sft_spec(tmp_path / "out", str(broken))
    with pytest.raises(StageFailed) as e:
        run_worker(spec, LaunchSpec(), tmp_path / "worker.log", env={})
    assert "exited with code 1" in str(e.value) and "last lines" in str(e.value)
    assert "Error" in str(e.value)  # the worker's own exception text reaches the user


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def _stage_dir(home: Path, stage: str, suffix: str = ".partial") -> Path | None:
    hits = list((home / "stages" / "smoke").glob(f"{stage}-*{suffix}"))
    return hits[0] if hits else None


def test_sigterm_to_the_flow_kills_the_stage_worker(tmp_path, tiny_model):
    home = tmp_path / "home"
    proc = subprocess.Popen([POSTTRAIN, "run", "smoke", "--profile", "tiny", "--set", "stages.cold_start.max_steps=5000"],
                            cwd=REPO, env=cli_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = wait_for(lambda: (d := _stage_dir(home, "cold_start")) and (d / "worker.pid").exists() and d / "worker.pid",
                        240, "the worker to start")
    worker = int(pid_file.read_text())
    assert _alive(worker)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    wait_for(lambda: not _alive(worker), 20, "the worker to die")


def test_killed_stage_resumes_from_its_checkpoint_and_earlier_stages_are_cached(tmp_path, tiny_model):
    home = tmp_path / "home"
    args = ["run", "smoke", "--profile", "tiny", "--set", "stages.polish.max_steps=60", "--set", "stages.polish.save_steps=5"]
    proc = subprocess.Popen([POSTTRAIN, *args], cwd=REPO, env=cli_env(home),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # a complete checkpoint: HF writes trainer_state.json last (a kill mid-save leaves one that is removed)
    complete = "checkpoint-*/trainer_state.json"
    ckpt = wait_for(lambda: (d := _stage_dir(home, "polish")) and sorted((d / "checkpoints").glob(complete)),
                    300, "polish's first complete checkpoint")
    partial = _stage_dir(home, "polish")
    worker = int((partial / "worker.pid").read_text())
    os.killpg(worker, signal.SIGKILL)  # the stage's whole process group, as a crash or OOM kill would
    proc.wait(timeout=120)
    assert proc.returncode == 1
    assert not _alive(worker)
    saved = max(int(p.parent.name.split("-")[1]) for p in (partial / "checkpoints").glob(complete))
    assert saved >= 5 and ckpt

    rerun = run_cli(*args, env_home=home, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    show = run_cli("show", "latest", "--json", env_home=home)
    record = json.loads(show.stdout)
    cold, polish = record["stages"]
    assert cold["cached"] is True and polish["cached"] is False
    assert polish["metrics"]["train/resumed_from_step"] == saved
    assert polish["metrics"]["train/global_step"] == 60
    assert _stage_dir(home, "polish") is None  # the partial dir was published


def test_zero3_on_two_ranks_hands_on_one_consolidated_model(tmp_path, tiny_model):
    """Under ZeRO-3 each rank holds a shard of every weight; the stage must still publish one plain
    Hugging Face safetensors model with full-size tensors that the next stage can load, and
    evaluate it on rank 0."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    spec = sft_spec(tmp_path / "out", str(tiny_model), str(REPO / "infra/deepspeed/zero3.json"), eval_rows=4)
    run_worker(spec, LaunchSpec(mode="deepspeed", ranks=2, deepspeed_config="zero3"), tmp_path / "worker.log", env={})
    # Rank 0 loads and generates with the whole model: no zero.Init, no synced generation with rank 1.
    assert "eval/accuracy" in json.loads((tmp_path / "out" / "result.json").read_text())["metrics"]
    saved = load_file(str(tmp_path / "out" / "model" / "model.safetensors"))
    before = AutoModelForCausalLM.from_pretrained(str(tiny_model)).state_dict()
    assert not [k for k, t in saved.items() if t.numel() == 0], "partitioned (empty) tensors were saved"
    assert {k: tuple(t.shape) for k, t in saved.items()} == {k: tuple(before[k].shape) for k in saved}
    assert any(not torch.equal(saved[k].float(), before[k].float()) for k in saved), "training changed nothing"
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out" / "model"))
    assert torch.equal(reloaded.state_dict()["model.embed_tokens.weight"].float(),
                       saved["model.embed_tokens.weight"].float())


@pytest.mark.parametrize("zero3", [True, False], ids=["zero3-2-ranks", "one-process"])
def test_lora_adapters_are_merged_into_a_plain_model(tmp_path, tiny_model, zero3):
    """LoRA adapters, also trained under ZeRO-3 (sharded base weights on each rank), are gathered,
    merged into the input model and published as one plain model: no adapter files, no `lora_`
    weights."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ds = str(REPO / "infra/deepspeed/zero3.json") if zero3 else None
    spec = sft_spec(tmp_path / "out", str(tiny_model), ds, max_steps=6, lora={"r": 8, "alpha": 16, "dropout": 0.0},
                    learning_rate=5e-2)
    launch = LaunchSpec(mode="deepspeed", ranks=2, deepspeed_config="zero3") if zero3 else LaunchSpec()
    run_worker(spec, launch, tmp_path / "worker.log", env={})
    model_dir = tmp_path / "out" / "model"
    assert not (model_dir / "adapter_config.json").exists() and not (tmp_path / "out" / "adapter").exists()
    saved = load_file(str(model_dir / "model.safetensors"))
    before = AutoModelForCausalLM.from_pretrained(str(tiny_model)).state_dict()
    assert not [k for k in saved if "lora_" in k or "base_layer" in k], "adapters were not merged"
    assert {k: tuple(t.shape) for k, t in saved.items()} == {k: tuple(before[k].shape) for k in saved}
    changed = [k for k in saved if not torch.equal(saved[k].float(), before[k].float())]
    assert changed and all("proj" in k for k in changed), "the merge changed the adapted projections only"
    AutoModelForCausalLM.from_pretrained(str(model_dir))  # loads as a plain model


def test_a_warm_worker_is_set_up_as_a_launched_one(tmp_path, monkeypatch):
    """Forked from the warm server (pipeline.launch.warm), a worker still finds the ML stack
    imported, leads its own session, has exactly the stage's environment, the working directory,
    the thread budget and its log, and its exit status comes back as Popen's would: a code, a
    traceback's 1, a signal's negative number."""
    from pipeline.launch import warm

    monkeypatch.chdir(REPO / "tests")  # where `warm_target` is found, as `python -m` would find it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "POSTTRAIN_CHECK": "42"}
    env.pop("HOME", None)
    log = tmp_path / "worker.log"
    report = tmp_path / "report.json"
    proc = warm.launch([str(report)], log, env, module="warm_target")
    assert proc.wait(timeout=300) == 3 and proc.poll() == 3
    seen = json.loads(report.read_text())
    assert seen["preloaded"] and seen["sid"] == seen["pid"] == proc.pid
    assert seen["env"] == env and seen["cwd"] == str(REPO / "tests") and seen["threads"] == 1
    assert seen["argv"][1:] == [str(report)] and "hello from the warm worker" in log.read_text()

    # Only the flow may ask: the socket is abstract (no file permissions), so the server checks its
    # peer's pid; another local process's request is dropped unanswered, nothing forked.
    intruder = f"""import json, socket
s = socket.socket(socket.AF_UNIX); s.connect({warm.start_server()!r})
try:
    s.sendall(json.dumps({{"module": "warm_target", "argv": ["{tmp_path / 'intruder.json'}"], "log": "{log}",
                          "env": {{}}, "cwd": "."}}).encode() + b"\\n")
    print("answered" if s.recv(16) else "refused")
except OSError:
    print("refused")"""
    asked = subprocess.run([sys.executable, "-c", intruder], capture_output=True, text=True, timeout=60)
    assert asked.stdout.strip() == "refused" and not (tmp_path / "intruder.json").exists(), asked.stderr

    raised = warm.launch([str(report), "raise"], log, env, module="warm_target")
    assert raised.wait(timeout=60) == 1 and "ValueError: a worker that fails" in log.read_text()
    assert warm.launch([str(report), "signal"], log, env, module="warm_target").wait(timeout=60) == -signal.SIGKILL


def test_stopping_a_warm_worker_stops_its_whole_group(tmp_path, monkeypatch):
    """What the supervisor does on a timeout, a failed check or a cancelled flow (kill_group), done
    to a forked worker: it and the process it started end."""
    from pipeline.launch import warm
    from pipeline.launch.processes import kill_group

    monkeypatch.chdir(REPO / "tests")
    report = tmp_path / "report.json"
    proc = warm.launch([str(report), "sleep"], tmp_path / "worker.log", dict(os.environ), module="warm_target")
    wait_for(lambda: report.exists() and _group(proc.pid) >= 2, 300, "the worker and its sleep")
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.1)
    kill_group(proc, grace_s=5)
    assert proc.returncode == -signal.SIGTERM
    wait_for(lambda: _group(proc.pid) == 0, 10, "the group to end")


def test_forked_deepspeed_ranks_get_the_launchers_variables_and_fail_together(tmp_path, monkeypatch):
    """One node's DeepSpeed ranks forked from the warm server: each sees what
    deepspeed.launcher.launch would give it; when one rank fails, the others are stopped (a rank
    left waiting in a collective would hang the stage) and the launch ends with the failed code."""
    from pipeline.launch import warm

    monkeypatch.chdir(REPO / "tests")
    report = tmp_path / "report.json"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    proc = warm.launch([str(report)], tmp_path / "worker.log", env, module="warm_target", ranks=2)
    assert proc.wait(timeout=300) == 3
    for rank in ("0", "1"):
        seen = json.loads(Path(f"{report}.{rank}").read_text())
        assert seen["argv"][1:] == [f"--local_rank={rank}", str(report)] and seen["preloaded"]
        assert seen["sid"] == proc.pid != seen["pid"]  # in the leader's session: one killpg stops the launch
        assert seen["env"] == {**env, "RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": "2", "LOCAL_SIZE": "2",
                               "CROSS_RANK": "0", "CROSS_SIZE": "1"}

    log = tmp_path / "failing.log"
    failing = warm.launch([str(report), "rank_1_fails"], log, env, module="warm_target", ranks=2)
    assert failing.wait(timeout=120) == 5
    assert "rank 1 (pid" in log.read_text() and "exited with code 5; stopping the other ranks" in log.read_text()
    wait_for(lambda: _group(failing.pid) == 0, 10, "rank 0 to be stopped")

    env.pop("MASTER_PORT")
    with pytest.raises(ValueError, match="MASTER_ADDR and MASTER_PORT"):
        warm.launch([str(report)], log, env, module="warm_target", ranks=2)


def test_forked_ranks_whose_first_torch_work_is_in_threads_do_not_lose_the_thread_pool(tmp_path, monkeypatch):
    """torch replaces its pthreadpool after a fork without a lock; a rank whose first parallel work
    ran in several new threads at once (transformers' weight loading) failed with `Invalid thread
    pool!` in 5-33% of forks (benchmarks/fork_thread_pool.py; the rate falls with the machine's load).
    Twelve ranks pass by chance about once in a hundred at the idle rate, about half the time at 5%."""
    from pipeline.launch import warm

    monkeypatch.chdir(REPO / "tests")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29556", "OMP_NUM_THREADS": "2"}
    for attempt in range(6):
        log = tmp_path / f"worker-{attempt}.log"
        code = warm.launch([str(tmp_path / "report.json"), "threads_first"], log, env, module="warm_target",
                           ranks=2).wait(timeout=120)
        assert code == 0, log.read_text()[-2000:]


def _group(pgid: int) -> int:
    """Live processes in process group `pgid`."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        count += int(fields[2]) == pgid and fields[0] != "Z"
    return count


def test_the_warm_server_starts_early_only_when_a_stage_will_train(tmp_path):
    """`posttrain run` starts the warm server while the run itself starts (its imports overlap the
    temporary Prefect API's) when some stage was never published in this home; a rerun of
    published stages starts none up front."""
    probe = ("from pipeline.launch import warm; from pipeline.recipe import load_recipe; "
             "warm.start_early(load_recipe('smoke', 'tiny').recipe); print(warm._Server.proc is not None)")
    env = {**os.environ, "POSTTRAIN_HOME": str(tmp_path / "home")}
    started = lambda: subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True,
                                     text=True, timeout=120).stdout.strip()
    assert started() == "True"
    for stage in ("cold_start", "polish"):  # smoke's stages, each published once
        (tmp_path / "home" / "stages" / "smoke" / f"{stage}-0123").mkdir(parents=True)
        (tmp_path / "home" / "stages" / "smoke" / f"{stage}-0123" / "result.json").write_text("{}")
    assert started() == "False"
    env.update(POSTTRAIN_HOME=str(tmp_path / "fresh"), POSTTRAIN_WARM_WORKERS="0")
    assert started() == "False"  # switched off: never, however new the home


def test_a_warm_worker_switch_that_is_neither_0_nor_1_is_refused_by_name(monkeypatch):
    from pipeline.launch import warm

    monkeypatch.setenv("POSTTRAIN_WARM_WORKERS", "false")
    with pytest.raises(ValueError, match="POSTTRAIN_WARM_WORKERS is 0 .* or 1, not 'false'"):
        warm.enabled()
