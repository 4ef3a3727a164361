"""TRL's vLLM server mode: `trl vllm-serve` on dedicated GPUs, the trainer's ranks on the others.

The launcher starts the server on the head node's first `gpus` GPUs, waits for its `/health`, runs
the stage on the GPUs after them (the GRPO config points TRL's client at the server), and stops the
server whatever happens; the server's log is `vllm_server.log` beside the stage's `worker.log`.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.launch.processes import die_with_parent, kill_group
from stages.launch import RolloutServer

LOG_NAME = "vllm_server.log"


class ServerFailed(RuntimeError):
    pass


def server_command(server: RolloutServer, model: str) -> list[str]:
    tp = server.tensor_parallel_size or server.gpus
    return [str(Path(sys.executable).parent / "trl"), "vllm-serve", "--model", model,
            "--tensor_parallel_size", str(tp), "--data_parallel_size", str(server.gpus // tp),
            "--host", server.host, "--port", str(server.port),
            "--gpu_memory_utilization", str(server.gpu_memory_utilization), *server.extra_args]


def gpu_split(server: RolloutServer, trainer_ranks: int, available: int) -> tuple[list[int], list[int]]:
    """(server GPUs, trainer GPUs) on this node, or a clear error when they do not fit."""
    if server.gpus + trainer_ranks > available:
        raise ServerFailed(f"the rollout server's {server.gpus} GPU(s) plus {trainer_ranks} trainer rank(s) need "
                           f"{server.gpus + trainer_ranks} GPUs; this node has {available}")
    return list(range(server.gpus)), list(range(server.gpus, server.gpus + trainer_ranks))


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, log_path: Path) -> float:
    """Poll `url` until it answers 200; fail early if the server exits. Returns seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if proc.poll() is not None:
            raise ServerFailed(f"the rollout server exited with code {proc.returncode} before it was healthy; "
                               f"its log: {log_path}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1.0)
    raise ServerFailed(f"the rollout server was not healthy at {url} after {timeout_s:.0f} s; its log: {log_path}")


@contextmanager
def rollout_server(cmd: list[str], server: RolloutServer, gpus: list[int], log_path: Path,
                   env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """Run the server on `gpus` for the duration of the block; nothing of it outlives the block."""
    env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
    with open(log_path, "ab") as log:
        log.write(f"$ CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=die_with_parent)
    try:
        waited = wait_healthy(f"http://{server.host}:{server.port}/health", proc, server.startup_timeout_s, log_path)
        with open(log_path, "ab") as log:
            log.write(f"posttrain: server healthy after {waited:.1f} s\n".encode())
        yield proc
    finally:
        kill_group(proc)
