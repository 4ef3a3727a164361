"""Run a stage's worker: in-process, as one subprocess, or as N ranks under the DeepSpeed launcher.

The worker runs in its own process group (its own session), so one killpg stops every rank. If the
flow process is interrupted, cancelled (SIGTERM) or fails, the group is terminated, then killed;
workers also die with their parent (PR_SET_PDEATHSIG) if the flow is SIGKILLed. A failed worker's
log tail is put into the error the user sees.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.processes import die_with_parent
from stages.kinds.common import LaunchSpec
from stages.kinds.contracts import WorkerSpec

TAIL_LINES = 40


class StageFailed(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_command(spec_path: Path, launch: LaunchSpec) -> list[str]:
    if launch.mode == "deepspeed":
        deepspeed = str(Path(sys.executable).parent / "deepspeed")
        return [deepspeed, "--num_gpus", str(launch.ranks), "--master_addr", "127.0.0.1",
                "--master_port", str(free_port()), "--module", "pipeline.worker", str(spec_path)]
    return [sys.executable, "-m", "pipeline.worker", str(spec_path)]


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    if not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").replace("\r", "\n")
    kept = [ln for ln in text.splitlines() if ln.strip() and "it/s]" not in ln and "s/it]" not in ln]
    return "\n".join(kept[-lines:])


def kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def run_worker(spec_path: Path, launch: LaunchSpec, log_path: Path, env: dict[str, str],
               on_progress: Callable[[dict], None] | None = None) -> None:
    """Run the worker for `spec_path` to completion or raise StageFailed with its log tail."""
    spec = WorkerSpec.model_validate_json(spec_path.read_text())
    out_dir = Path(spec.output_dir)
    if launch.mode == "inprocess":
        from pipeline.worker import run_spec  # imports torch: only the in-process mode pays for it

        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            run_spec(spec)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        return

    cmd = worker_command(spec_path, launch)
    full_env = {**os.environ, **env}
    if launch.ranks > 1:  # share the cores between ranks instead of oversubscribing them
        full_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // launch.ranks)))
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True, preexec_fn=die_with_parent)
    (out_dir / "worker.pid").write_text(str(proc.pid))
    started, last_progress = time.time(), None
    try:
        while proc.poll() is None:
            time.sleep(1.0)
            progress = _read_progress(out_dir)
            if progress and progress != last_progress and on_progress:
                on_progress(progress)
                last_progress = progress
            if launch.timeout_s and time.time() - started > launch.timeout_s:
                kill_group(proc)
                raise StageFailed(f"stage timed out after {launch.timeout_s} s; log: {log_path}\n{log_tail(log_path)}")
    finally:
        kill_group(proc)  # no-op when it already exited; otherwise nothing may outlive the flow
    if proc.returncode != 0:
        how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with code {proc.returncode}"
        raise StageFailed(f"stage worker {how}; full log: {log_path}\n--- last lines ---\n{log_tail(log_path)}")


def _read_progress(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / "progress.json").read_text())
    except (OSError, ValueError):
        return None
