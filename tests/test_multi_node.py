"""Two simulated nodes on this machine train one SFT stage together: the head's launcher (node 0, as
`posttrain run` runs it) and a follower (`posttrain node --rank 1`), one CPU rank each, DeepSpeed
`--no_ssh` launchers meeting on loopback through a shared POSTTRAIN_HOME. A node that never joins,
a node whose process is killed mid-stage, and a node that freezes (no TCP reset, so only the
heartbeat can tell) fail the stage on the head within the stated timeout, and no rank of the lost
node survives it; the rerun resumes from the last checkpoint on both nodes."""

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from pipeline.launch.processes import free_port
from pipeline.launch.workers import StageFailed, run_worker
from stages.launch import LaunchSpec
from tests.conftest import POSTTRAIN, REPO, cli_env
from tests.test_launcher import _alive, sft_spec

pytestmark = pytest.mark.slow

MAX_STEPS = 120
HOSTS = ["node0 slots=1", "node1 slots=1"]  # names are labels here: --no_ssh never resolves them


def two_nodes(timeout_s: int) -> LaunchSpec:
    return LaunchSpec(mode="deepspeed", deepspeed_config="zero2", nodes=HOSTS, no_ssh=True, master_addr="127.0.0.1",
                      master_port=free_port(), node_timeout_s=timeout_s)


def start_follower(home, log, *flags) -> subprocess.Popen:
    return subprocess.Popen([POSTTRAIN, "node", "--rank", "1", *flags], env=cli_env(home), cwd=REPO,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def _descendants_of(pid: int) -> list[int]:
    """The processes that inherited `posttrain node`'s watch pid: its launcher, DeepSpeed's and the ranks."""
    found = []
    for proc in os.listdir("/proc"):
        try:
            if proc.isdigit() and f"POSTTRAIN_WATCH_PID={pid}".encode() in open(f"/proc/{proc}/environ", "rb").read():
                found.append(int(proc))
        except OSError:
            pass
    return found


def lose_node_after_a_checkpoint(home, out, spec, env, tmp_path, after_step: int, lose, timeout_s: int):
    """Run the stage on two nodes until a checkpoint newer than `after_step`, `lose(follower)`, and
    return (seconds from the loss to the head's failure, the failure, the newest complete checkpoint)."""
    follower = start_follower(home, tmp_path / "follower.log")
    failures: list[tuple[float, BaseException]] = []

    def head():
        try:
            run_worker(spec, two_nodes(timeout_s), out / "worker.log", env)
        except StageFailed as e:
            failures.append((time.monotonic(), e))

    runner = threading.Thread(target=head)
    runner.start()
    deadline = time.time() + 300
    while _newest_checkpoint(out) <= after_step:
        assert time.time() < deadline and runner.is_alive(), f"no checkpoint; head log:\n{(out / 'worker.log').read_text()}"
        time.sleep(0.02)
    lost_at = time.monotonic()
    lose(follower)
    runner.join(timeout=120)
    assert failures, "the head did not fail after node 1 was lost"
    assert not (out / "result.json").exists()
    saved = _newest_checkpoint(out)
    assert saved < MAX_STEPS
    return failures[0][0] - lost_at, failures[0][1], saved


def _newest_checkpoint(out) -> int:
    return max((int(p.parent.name.split("-")[1]) for p in out.glob("checkpoints/checkpoint-*/trainer_state.json")),
               default=0)


def test_two_nodes_train_one_stage_a_lost_node_fails_it_and_the_rerun_resumes(tmp_path, tiny_model, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("POSTTRAIN_HOME", str(home))
    out = home / "stages" / "two_nodes" / "sft-0"
    spec = sft_spec(out, str(tiny_model), str(REPO / "infra/deepspeed/zero2.json"), max_steps=MAX_STEPS,
                    save_steps=10)
    env = {"POSTTRAIN_HOME": str(home)}

    # 1. nobody runs node 1: the head gives up after node_timeout_s instead of waiting at the rendezvous
    started = time.monotonic()
    with pytest.raises(StageFailed, match="node 1 has not joined after 8 s"):
        run_worker(spec, two_nodes(8), out / "worker.log", env)
    assert time.monotonic() - started < 8 + 30
    print(f"the head gave up on a missing node after {time.monotonic() - started:.1f} s")
    assert json.loads((home / "nodes" / "launch.json").read_text())["state"] == "withdrawn"

    # 2. node 1 joins, then its `posttrain node` is SIGKILLed after a checkpoint: its ranks must not outlive it
    def kill(follower):
        os.kill(follower.pid, signal.SIGKILL)
        follower.wait()  # reaped, as a lost machine's processes are gone (a zombie would still answer kill -0)

    lost_after, error, saved = lose_node_after_a_checkpoint(home, out, spec, env, tmp_path, 0, kill, timeout_s=30)
    assert lost_after < 30 + 15, "the head hung past the node timeout"
    print(f"head failed {lost_after:.1f} s after node 1 was killed: {str(error)[:160]}")
    node_log = (out / "worker-node1.log").read_text()
    assert "--node_rank 1" in node_log and "dist_world_size=2" in node_log
    time.sleep(3)  # the ranks' watch of their `posttrain node` runs every 2 s
    assert subprocess.run(["pgrep", "-f", str(spec)], capture_output=True).stdout == b"", "a rank outlived its node"

    # 2b. the rerun resumes; then node 1 freezes (a machine lost without a TCP reset: the head's
    # collective would wait 30 minutes): its silence fails the stage after node_timeout_s
    frozen: list[int] = []

    def freeze(follower):
        frozen.extend([follower.pid, *_descendants_of(follower.pid)])
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)

    lost_after, error, saved = lose_node_after_a_checkpoint(home, out, spec, env, tmp_path, saved, freeze, timeout_s=10)
    for pid in frozen:
        os.kill(pid, signal.SIGKILL)
    assert "node 1 has not reported for 10 s" in str(error) and lost_after < 10 + 15
    print(f"head failed {lost_after:.1f} s after node 1 froze")

    # 3. node 1 comes back; the rerun resumes from the newest complete checkpoint on both nodes
    follower = start_follower(home, tmp_path / "follower.log", "--once")
    run_worker(spec, two_nodes(60), out / "rerun.log", env)
    assert follower.wait(timeout=60) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["metrics"]["train/resumed_from_step"] == saved
    assert result["metrics"]["train/global_step"] == MAX_STEPS
    assert "dist_world_size=2" in (out / "rerun.log").read_text()
    assert f"resuming from {out / 'checkpoints' / f'checkpoint-{saved}'}" in (out / "worker-node1.log").read_text()
    # the same output as a one-node stage: a consolidated model that loads
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out / "model") is not None
    assert not _alive(follower.pid)


def test_the_ssh_launch_hands_deepspeed_the_hostfile_and_the_environment(tmp_path, tiny_model, monkeypatch):
    """DeepSpeed's own multi-node launch (pdsh over ssh) cannot reach other machines here: this runs
    it as far as it goes (the real runner, which stops at its ssh check) and checks what it was given."""
    monkeypatch.setenv("POSTTRAIN_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    spec = sft_spec(out, str(tiny_model), str(REPO / "infra/deepspeed/zero2.json"))
    launch = LaunchSpec(mode="deepspeed", nodes=["gpu-a slots=8", "gpu-b slots=8"])
    env = {"POSTTRAIN_HOME": str(tmp_path / "home"), "MLFLOW_TRACKING_URI": "http://tracking:5000"}
    with pytest.raises(StageFailed):
        run_worker(spec, launch, out / "worker.log", env)
    assert (out / "hostfile").read_text() == "gpu-a slots=8\ngpu-b slots=8\n"
    assert (out / "deepspeed_env").read_text().splitlines() == [f"POSTTRAIN_HOME={tmp_path / 'home'}",
                                                                "MLFLOW_TRACKING_URI=http://tracking:5000"]
    log = (out / "worker.log").read_text()
    assert f"--hostfile {out / 'hostfile'} --master_addr gpu-a --master_port 29500 --module pipeline.worker" in log
    assert "--no_ssh" not in log
    assert "host=gpu-a was not reachable via ssh" in log  # how far it got: DeepSpeed's runner checked ssh


def test_rank_zero_is_the_head_not_a_follower(tmp_path):
    proc = subprocess.run([POSTTRAIN, "node", "--rank", "0"], env=cli_env(tmp_path / "home"), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "node rank 0 is the head: it runs `posttrain run`" in proc.stderr
