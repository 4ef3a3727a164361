"""Warm workers: a stage's worker forked from a server that has already imported the ML stack.

A fresh `python -m pipeline.worker` spends 9-11 s on a 2-core machine importing torch, transformers,
TRL, peft, datasets and DeepSpeed before its first step (benchmarks/RESULTS.md, "What one stage's
worker process costs"); a recipe starts one per stage (r1: 10), and the test suite about a hundred.
So a flow process keeps one warm server (`python -m pipeline.launch.warm`, its child) which
imports that stack once, then forks a worker per stage in milliseconds. A forked worker is set up
as a launched one would be: its own session (one killpg stops it and all it starts), its output
appended to the stage's log, the stage's environment and working directory, the thread budget
applied explicitly (OpenMP read OMP_NUM_THREADS when the server loaded it), death with the server,
which ends within seconds of the flow. The server reports each worker's pid, then its exit status
(negative: killed by that signal), as subprocess.Popen does.

Only third-party modules are preloaded (and this module, with pipeline.launch.processes): a worker
imports the rest of posttrain's code as it is on disk when its stage starts, as a fresh interpreter
would. CPU machines only: a forked child must not inherit a CUDA state, and DeepSpeed probes the
accelerator as it is imported, so on a machine with GPUs (or when `POSTTRAIN_WARM_WORKERS=0`)
workers start as fresh interpreters.

A single-node DeepSpeed launch is forked too: `deepspeed` (the runner) and
`deepspeed.launcher.launch` are two more interpreters that import torch before the ranks, which
import everything again; together about 20 s of a 2-rank stage's start here. The forked launch does
what `deepspeed.launcher.launch` does for one node: a leader in the stage's session forks each rank
with the variables that launcher sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK,
CROSS_SIZE, MASTER_ADDR, MASTER_PORT), passes `--local_rank=<n>`, runs the ranks unbuffered (`-u`),
and when one rank fails, kills the others and exits with the failed rank's code. Multi-node launches
and launches beside a rollout server keep DeepSpeed's own launcher.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from pipeline.launch.processes import die_with_parent

# What a worker imports before its first step (stages/*.py): the trainers pull in transformers'
# Trainer, peft and accelerate; DeepSpeed (2-3 s more) is what every rank of a forked DeepSpeed
# launch imports. One that fails to import is skipped: the worker imports it itself, and its error
# shows in the stage's log.
PRELOAD = ("torch", "transformers", "datasets", "peft", "trl.trainer.sft_trainer", "trl.trainer.grpo_trainer",
           "trl.trainer.dpo_trainer", "trl.trainer.reward_trainer", "deepspeed")
ENV_SWITCH = "POSTTRAIN_WARM_WORKERS"  # "0": every worker a fresh interpreter
START_TIMEOUT_S = 300.0  # the server's imports, on a loaded machine


def enabled() -> bool:
    """Warm workers apply on this machine: not switched off, and no GPU device."""
    switch = os.environ.get(ENV_SWITCH, "1")
    if switch not in ("0", "1"):
        raise ValueError(f"{ENV_SWITCH} is 0 (workers start as fresh interpreters) or 1, not {switch!r}")
    return switch == "1" and not glob.glob("/dev/nvidia[0-9]*") and not os.path.exists("/dev/kfd")


def applies(launch) -> bool:
    """Whether a stage launched as `launch` (stages.launch.LaunchSpec) gets forked workers: one
    worker process or one node's DeepSpeed ranks (no nodes, no rollout server beside it) on a
    machine where warm workers are enabled."""
    return (launch.mode in ("subprocess", "deepspeed") and launch.nodes is None and launch.rollout_server is None
            and enabled())


class WarmProcess:
    """A forked worker, seen through the part of subprocess.Popen the supervisor uses."""

    def __init__(self, conn: socket.socket, pid: int):
        self._conn, self.pid, self.returncode = conn, pid, None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"warm worker {self.pid}", timeout)
            self._read_status()
        return self.returncode

    def _read_status(self) -> None:
        line = _read_line(self._conn)
        # No status: the server itself went away, and the worker with it (it dies with the server).
        self.returncode = int(line) if line else -9
        self._conn.close()


class _Server:
    """The flow process's warm server: started once, on first use, shared by its threads."""
    lock = threading.Lock()
    proc: subprocess.Popen | None = None
    address: str | None = None


def start_server() -> str:
    """The server's socket address, starting it if needed (returns once it listens; the preload
    may still run, and the first fork waits for it)."""
    with _Server.lock:
        if _Server.proc is not None and _Server.proc.poll() is None:
            return _Server.address
        address = f"\0posttrain-warm-{os.getpid()}-{time.monotonic_ns()}"  # abstract: no file to clean up
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(16)
        # PR_SET_PDEATHSIG fires when the *thread* that started the server ends: safe from the main
        # thread (the flow calls this before a stage's task, pipeline.flow), not from a task thread
        # that may end while the server serves others; the server also watches its parent's pid.
        main = threading.current_thread() is threading.main_thread()
        try:  # its own output is the preload's import noise; each worker's goes to the stage's log
            _Server.proc = subprocess.Popen([sys.executable, "-m", "pipeline.launch.warm", str(listener.fileno())],
                                            pass_fds=[listener.fileno()], stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            preexec_fn=die_with_parent if main else None)
        finally:
            listener.close()  # the server holds its own copy
        _Server.address = address
        return address


def start_early(recipe) -> None:
    """Start the server now, so that its imports overlap the run's own start (the CLI's imports,
    MLflow's store, a temporary Prefect API), when some stage of `recipe` has never been published
    in this home. A rerun whose stages were all published before starts it, if at all, only when a
    stage must train (pipeline.flow): a cached rerun does not pay for imports it would not use."""
    from pipeline.store.home import home  # not at the top: the server process imports this module

    published = home() / "stages" / recipe.name
    if any(applies(s.launcher) and not any(published.glob(f"{s.name}-*/result.json")) for s in recipe.stages):
        start_server()


def launch(argv: list[str], log_path: Path, env: dict[str, str], module: str = "pipeline.worker",
           ranks: int | None = None) -> WarmProcess:
    """Fork `python -m <module> <argv>` (its `main(argv)`) from the warm server, in this process's
    working directory, output appended to `log_path`, with exactly `env` as its environment. With
    `ranks`, that many DeepSpeed ranks on this node under one leader, whose pid and exit status
    these are; `env` must then hold MASTER_ADDR and MASTER_PORT."""
    if ranks is not None and not {"MASTER_ADDR", "MASTER_PORT"} <= env.keys():
        raise ValueError("a forked DeepSpeed launch needs MASTER_ADDR and MASTER_PORT in its environment")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(start_server())
    request = {"module": module, "argv": argv, "log": str(log_path), "env": env, "cwd": os.getcwd(), "ranks": ranks}
    conn.sendall(json.dumps(request).encode() + b"\n")
    ready, _, _ = select.select([conn], [], [], START_TIMEOUT_S)
    line = _read_line(conn) if ready else ""
    if not line:
        conn.close()
        raise RuntimeError(f"the warm worker server did not fork a worker within {START_TIMEOUT_S:.0f} s; "
                           f"set {ENV_SWITCH}=0 to start workers as fresh interpreters")
    return WarmProcess(conn, int(line))


def _read_line(conn: socket.socket) -> str:
    """One line, read a byte at a time: the pid and the exit status can arrive together, and the
    status must stay in the socket (select on it says the worker ended)."""
    data = bytearray()
    while not data.endswith(b"\n"):
        byte = conn.recv(1)
        if not byte:
            break
        data += byte
    return data.decode().strip()


def _from_the_flow(conn: socket.socket, flow: int) -> bool:
    """Whether the peer is the flow process itself. An abstract socket has no file permissions:
    any local process could connect, and a request names the module a worker runs."""
    pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid == flow


# ---- the server process -------------------------------------------------------------------------

def serve(listener: socket.socket) -> None:
    """Preload, then fork one worker per request; tell each requester its worker's pid and, when it
    ends, its exit status. Runs until the flow process (its parent) is gone."""
    flow = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the flow's to handle (it stops the workers)
    for name in PRELOAD:
        with contextlib.suppress(Exception):  # one that fails here is imported, and fails, in the worker
            importlib.import_module(name)
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the requester's connection)
    while True:
        ready, _, _ = select.select([listener, *waiting], [], [], 2.0)
        if os.getppid() != flow:  # the flow is gone (started from a task thread: no PDEATHSIG); each
            # worker dies with this process (its own PDEATHSIG)
            return
        for fd in ready:
            if fd is listener:
                conn, _ = listener.accept()
                if not _from_the_flow(conn, flow):
                    conn.close()
                    continue
                pid = _fork_worker(json.loads(_read_line(conn)), listener, conn, waiting)
                with contextlib.suppress(OSError):  # the flow stopped listening: the status is never read
                    conn.sendall(f"{pid}\n".encode())
                waiting[os.pidfd_open(pid)] = (pid, conn)
            else:
                pid, conn = waiting.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # the flow stopped listening
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()


def _fork_worker(request: dict, listener: socket.socket, conn: socket.socket, waiting: dict) -> int:
    """Fork the worker; returns its pid once it leads its own session, so that a killpg of that pid
    reaches it from the moment the flow learns the pid."""
    started_r, started_w = os.pipe()
    pid = _fork()
    if pid:
        os.close(started_w)
        os.read(started_r, 1)  # empty if it died first: its exit status tells
        os.close(started_r)
        return pid
    code = 1
    try:
        os.setsid()
        die_with_parent()
        os.close(started_r)
        os.write(started_w, b"1")
        os.close(started_w)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        listener.close()
        conn.close()
        for fd, (_, other) in waiting.items():
            os.close(fd)
            other.close()
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        nothing = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nothing, 0)
        os.close(nothing)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _apply_thread_budget()
        sys.path[0] = request["cwd"]  # as `python -m` puts the working directory first
        code = _lead_ranks(request) if request.get("ranks") else _run_main(request["module"], request["argv"])
    except BaseException:
        traceback.print_exc()
    finally:
        _exit(code)


def _apply_thread_budget() -> None:
    """The stage's thread budget, set in a forked child's main thread before it starts threads of its own.

    OpenMP read OMP_NUM_THREADS when the server imported torch, so the count is set explicitly. The
    call also mends what a fork leaves behind: torch marks its pthreadpool as corrupt in the child
    and replaces it, without a lock, on the pool's next use (caffe2/utils/threadpool/pthreadpool-cpp.cc).
    The main thread never makes that use itself (its per-thread init was done before the fork), so the
    first users are new threads, and when several start at once (transformers loads weights with 4)
    one can find no pool: `RuntimeError: ... Invalid thread pool!`. Setting the count here replaces the
    pool while one thread runs. Measured with torch 2.13 (benchmarks/fork_thread_pool.py): ranks forked
    as here whose first work converts tensors in 4 threads failed 7-50 times in 150 without this call,
    depending on the machine's load, and 0 times with it.
    """
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1))


def _fork() -> int:
    """os.fork, this process's buffered output written out first so no child writes it again."""
    sys.stdout.flush()
    sys.stderr.flush()
    return os.fork()


def _run_main(module_name: str, argv: list[str]) -> int:
    """`python -m <module_name> <argv>`: its main, and the exit code an interpreter would give."""
    try:
        module = importlib.import_module(module_name)
        sys.argv = [module.__file__, *argv]
        returned = module.main(argv)
        return returned if isinstance(returned, int) else 0
    except SystemExit as e:  # as an interpreter exits: None is 0, a message is printed and is 1
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
        return 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        return 1


def _exit(code: int) -> None:
    """End a forked process as an interpreter ends: atexit handlers (scoring pools close, MLflow
    flushes), flushed output, the exit code; never back into the server's loop."""
    with contextlib.suppress(BaseException):
        import atexit

        atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _lead_ranks(request: dict) -> int:
    """One node's DeepSpeed ranks, as `deepspeed.launcher.launch` starts them (module docstring);
    returns 0 when every rank did, else the first failure's code (128 + signal when killed), the
    others killed. They share this leader's process group, so one killpg stops them all."""
    ranks = request["ranks"]
    print(f"forked DeepSpeed launch: nnodes=1, num_local_procs={ranks}, dist_world_size={ranks}, "
          f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
    running: dict[int, int] = {}  # pid -> rank
    for rank in range(ranks):
        pid = _fork()
        if pid == 0:
            code = 1
            try:
                die_with_parent()
                os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_SIZE=str(ranks),
                                  CROSS_RANK="0", CROSS_SIZE="1")
                _apply_thread_budget()
                sys.stdout.reconfigure(line_buffering=True)  # `python -u`, as the launcher runs ranks
                sys.stderr.reconfigure(line_buffering=True)
                code = _run_main(request["module"], [f"--local_rank={rank}", *request["argv"]])
            finally:
                _exit(code)
        running[pid] = rank
    failed = 0
    while running:
        pid, status = os.wait()
        rank, code = running.pop(pid), os.waitstatus_to_exitcode(status)
        if code != 0 and not failed:
            print(f"rank {rank} (pid {pid}) " + (f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
                  + "; stopping the other ranks", file=sys.stderr, flush=True)
            failed = code if code > 0 else 128 - code
            for other in running:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(other, signal.SIGKILL)
    return failed


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
