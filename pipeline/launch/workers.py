"""Run a stage's worker: in-process, as one subprocess, as N ranks under the DeepSpeed launcher, or
across nodes (DeepSpeed over ssh from a hostfile, or `--no_ssh` launchers that meet through
`pipeline.launch.nodes`), optionally beside a vLLM rollout server (`pipeline.launch.rollout_server`).

The worker runs in its own process group (its own session), so one killpg stops every rank. If the
flow process is interrupted, cancelled (SIGTERM) or fails, the group is terminated, then killed;
workers also die with their parent (PR_SET_PDEATHSIG) if the flow is SIGKILLed. A failed worker's
log tail is put into the error the user sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from pipeline.launch import warm
from pipeline.launch.nodes import deepspeed_command, posted_launch, write_hostfile
from pipeline.launch.processes import die_with_parent, free_port, kill_group
from pipeline.launch.rollout_server import LOG_NAME, ServerFailed, gpu_split, rollout_server, server_command
from stages.contracts import WorkerSpec
from stages.launch import LaunchSpec, host_slots

TAIL_LINES = 40


class StageFailed(RuntimeError):
    pass


def worker_command(spec_path: Path, launch: LaunchSpec, gpus: list[int] | None = None,
                   master_port: int | None = None) -> list[str]:
    """One node's launch: the worker itself, or DeepSpeed's launcher for `ranks` ranks (on `gpus` when
    a rollout server holds the first ones) meeting at `master_port` (a free one if not given)."""
    if launch.mode == "deepspeed":
        deepspeed = str(Path(sys.executable).parent / "deepspeed")
        where = ["--include", "localhost:" + ",".join(map(str, gpus))] if gpus else ["--num_gpus", str(launch.ranks)]
        return [deepspeed, *where, "--master_addr", "127.0.0.1",
                "--master_port", str(master_port or free_port()), "--module", "pipeline.worker", str(spec_path)]
    return [sys.executable, "-m", "pipeline.worker", str(spec_path)]


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    if not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").replace("\r", "\n")
    kept = [ln for ln in text.splitlines() if ln.strip() and "it/s]" not in ln and "s/it]" not in ln]
    return "\n".join(kept[-lines:])


def run_worker(spec_path: Path, launch: LaunchSpec, log_path: Path, env: dict[str, str],
               on_progress: Callable[[dict], None] | None = None,
               in_process: Callable[[WorkerSpec], object] | None = None) -> None:
    """Run the worker for `spec_path` to completion or raise StageFailed with its log tail.
    `in_process` runs a spec in this process (`pipeline.worker.run_spec`, passed by the flow:
    launching starts processes and knows nothing of what a worker does inside one)."""
    spec = WorkerSpec.model_validate_json(spec_path.read_text())
    out_dir = Path(spec.output_dir)
    if launch.mode == "inprocess":
        if in_process is None:
            raise ValueError("launcher mode inprocess needs the in-process runner (pipeline.worker.run_spec)")
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            in_process(spec)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        return

    full_env = {**os.environ, **env}
    ranks = launch.ranks if launch.nodes is None else max(slots for _, slots in host_slots(launch))
    # An explicit thread budget for every worker: the cores shared between its ranks, never more
    # threads than cores (torch, and the generation engines through it, read OMP_NUM_THREADS).
    full_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
    fork = spec_path if warm.applies(launch) else None  # forked from the warm server (pipeline.launch.warm)
    with ExitStack() as stack:
        checks: list[Callable[[], str | None]] = []
        if launch.nodes is not None:
            cmd = _multi_node(spec_path, launch, out_dir, env, full_env, stack, checks)
        elif launch.rollout_server is not None:
            cmd = _beside_server(spec_path, launch, spec, out_dir, full_env, stack, checks)
        else:
            port = free_port() if launch.mode == "deepspeed" else None
            cmd = worker_command(spec_path, launch, master_port=port)
            if port and fork:  # forked ranks meet where DeepSpeed's launcher would send them
                full_env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        _supervise(cmd, launch, out_dir, log_path, full_env, checks, on_progress, fork)


def _multi_node(spec_path: Path, launch: LaunchSpec, out_dir: Path, env: dict[str, str], full_env: dict[str, str],
                stack: ExitStack, checks: list) -> list[str]:
    hosts = host_slots(launch)
    hostfile = write_hostfile(hosts, out_dir / "hostfile")
    master = launch.master_addr or hosts[0][0]
    if not launch.no_ssh:  # DeepSpeed starts every node's ranks over ssh, passing on the env file's variables
        env_file = out_dir / "deepspeed_env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        full_env["DS_ENV_FILE"] = str(env_file)
        return deepspeed_command(spec_path, hostfile, master, launch.master_port)
    posted = stack.enter_context(posted_launch(spec_path, hostfile, launch, master, env, len(hosts)))

    def nodes_alive() -> str | None:
        posted.heartbeat()
        return posted.problem()

    checks.append(nodes_alive)
    return deepspeed_command(spec_path, hostfile, master, launch.master_port, node_rank=0)


def _beside_server(spec_path: Path, launch: LaunchSpec, spec: WorkerSpec, out_dir: Path, full_env: dict[str, str],
                   stack: ExitStack, checks: list) -> list[str]:
    server = launch.rollout_server
    try:
        server_gpus, trainer_gpus = gpu_split(server, launch.ranks, launch.gpus_per_node or visible_gpus())
        proc = stack.enter_context(rollout_server(server_command(server, spec.inputs["model"]), server, server_gpus,
                                                  out_dir / LOG_NAME, full_env))
    except ServerFailed as e:
        raise StageFailed(f"{e}\n--- last lines ---\n{log_tail(out_dir / LOG_NAME)}") from None
    checks.append(lambda: None if proc.poll() is None else
                  f"the rollout server exited with code {proc.returncode}; its log: {out_dir / LOG_NAME}")
    if launch.mode == "deepspeed":
        return worker_command(spec_path, launch, trainer_gpus)
    full_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, trainer_gpus))
    return worker_command(spec_path, launch)


def visible_gpus() -> int:
    import torch  # only a stage beside a rollout server without gpus_per_node pays for it

    return torch.cuda.device_count()


def _supervise(cmd: list[str], launch: LaunchSpec, out_dir: Path, log_path: Path, full_env: dict[str, str],
               checks: list[Callable[[], str | None]], on_progress: Callable[[dict], None] | None,
               warm_spec: Path | None = None) -> None:
    """Run `cmd` in its own process group until it exits, a check reports a problem, or the timeout;
    with `warm_spec`, the same worker forked from the warm server instead of a fresh interpreter."""
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}{'  (forked from the warm worker server)' if warm_spec else ''}\n".encode())
        log.flush()
        ranks = launch.ranks if launch.mode == "deepspeed" else None  # one leader forks them (pipeline.launch.warm)
        proc = warm.launch([str(warm_spec)], log_path, full_env, ranks=ranks) if warm_spec else subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True, preexec_fn=die_with_parent)
    (out_dir / "worker.pid").write_text(str(proc.pid))
    started, last_progress = time.time(), None
    try:
        while proc.poll() is None:
            try:
                proc.wait(timeout=1.0)  # returns as soon as the worker exits, not at the next second
            except subprocess.TimeoutExpired:
                pass
            progress = _read_progress(out_dir)
            if progress and progress != last_progress and on_progress:
                on_progress(progress)
                last_progress = progress
            if launch.timeout_s and time.time() - started > launch.timeout_s:
                kill_group(proc)
                raise StageFailed(f"stage timed out after {launch.timeout_s} s; log: {log_path}\n{log_tail(log_path)}")
            for problem in filter(None, (check() for check in checks)):
                kill_group(proc)
                raise StageFailed(f"{problem}; this node's log: {log_path}\n--- last lines ---\n{log_tail(log_path)}")
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
