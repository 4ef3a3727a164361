"""TRL's vLLM server mode as the launcher runs it: the server starts on its own GPUs, the stage waits
for /health, and nothing of the server outlives the stage. vLLM cannot run on this CPU machine, so
the healthy path runs a stand-in HTTP server through the same lifecycle; the real `trl vllm-serve`
runs too, and its failure (no vLLM here) must fail the stage with its log, not hang."""

import json
import subprocess
import sys
import time

import pytest

from pipeline.launch.processes import free_port
from pipeline.launch.rollout_server import LOG_NAME, ServerFailed, gpu_split, rollout_server, server_command
from pipeline.launch.workers import StageFailed, run_worker
from stages.launch import LaunchSpec, RolloutServer
from tests.test_launcher import _alive

STAND_IN = """
import http.server, sys, time
time.sleep(1.5)  # a server that takes a while to load its model
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_the_server_command_and_the_gpu_split():
    server = RolloutServer(gpus=2, port=8123)
    cmd = server_command(server, "/models/policy")
    assert cmd[1:4] == ["vllm-serve", "--model", "/models/policy"]
    assert cmd[cmd.index("--tensor_parallel_size") + 1] == "2" and cmd[cmd.index("--port") + 1] == "8123"
    assert gpu_split(server, trainer_ranks=6, available=8) == ([0, 1], [2, 3, 4, 5, 6, 7])
    with pytest.raises(ServerFailed, match="need 9 GPUs; this node has 8"):
        gpu_split(server, trainer_ranks=7, available=8)


def test_the_stage_waits_for_health_and_the_server_does_not_outlive_it(tmp_path):
    port = free_port()
    server = RolloutServer(port=port, startup_timeout_s=60)
    log = tmp_path / LOG_NAME
    started = time.monotonic()
    with rollout_server([sys.executable, "-c", STAND_IN, str(port)], server, [0], log, {}) as proc:
        assert time.monotonic() - started >= 1.5  # not before the server answered
        assert proc.poll() is None
    assert not _alive(proc.pid)
    text = log.read_text()
    assert text.startswith("$ CUDA_VISIBLE_DEVICES=0 ") and "server healthy after" in text


def test_a_server_that_never_answers_fails_after_its_startup_timeout(tmp_path):
    server = RolloutServer(port=free_port(), startup_timeout_s=3)
    with pytest.raises(ServerFailed, match="not healthy at .* after 3 s"):
        with rollout_server([sys.executable, "-c", "import time; time.sleep(60)"], server, [0], tmp_path / "s.log", {}):
            pass
    assert subprocess.run(["pgrep", "-f", "time.sleep(60)"], capture_output=True).stdout == b""


def test_the_real_trl_vllm_serve_failing_fails_the_stage_with_its_log(tmp_path, tiny_model):
    out = tmp_path / "out"
    out.mkdir()
    spec = out / "spec.json"
    spec.write_text(json.dumps({"kind": "grpo", "stage": {}, "eval": None, "output_dir": str(out),
                                "inputs": {"model": str(tiny_model)}}))
    launch = LaunchSpec(gpus_per_node=2, rollout_server={"gpus": 1, "port": free_port(), "startup_timeout_s": 120})
    with pytest.raises(StageFailed, match="exited with code .* before it was healthy") as e:
        run_worker(spec, launch, out / "worker.log", env={})
    assert "vllm" in str(e.value).lower()  # the log tail says what is missing
    assert f"--model {tiny_model}" in (out / LOG_NAME).read_text()
    assert not (out / "worker.pid").exists()  # the trainer never started


def test_grpo_points_trls_client_at_the_launchers_server(tmp_path):
    from stages.grpo import GRPOConfig, trl_config
    from stages.runtime import StageContext

    port = free_port()
    cfg = GRPOConfig(name="rl", model="base", data="synthetic_math", rewards=[{"name": "format_think"}],
                     rollout="vllm_server", launcher={"rollout_server": {"port": port, "startup_timeout_s": 300}})
    args = trl_config(cfg, StageContext.local(tmp_path))
    assert (args.use_vllm, args.vllm_mode, args.vllm_server_host, args.vllm_server_port) == \
        (True, "server", "127.0.0.1", port)
    assert args.vllm_server_timeout == 300
