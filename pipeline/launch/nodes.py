"""Multi-node stages without ssh (Kubernetes, SLURM): DeepSpeed's `--no_ssh` launchers, one per node,
meeting on a POSTTRAIN_HOME that every node mounts.

The head node (where `posttrain run` runs) posts each multi-node stage in
`$POSTTRAIN_HOME/nodes/launch.json` and runs the DeepSpeed launcher for node 0. Every other node runs
`posttrain node --rank N`: it waits for a posted launch, runs its own DeepSpeed launcher with
`--no_ssh --node_rank N` on the same worker spec, and reports in `nodes/node-N.json` every second.
DeepSpeed does the rest: global ranks from the hostfile, rendezvous at master_addr:master_port.

Failure: ranks that fail make their node's launcher exit; the head sees the node's report and stops
its own ranks. A node whose report stops changing for `node_timeout_s` (a machine lost without a TCP
reset, where a collective would hang for torch's 30 minutes) fails the stage too. A follower stops
its ranks when the head withdraws the launch or its heartbeat stops. Liveness is judged by each
reader's own clock from when a report last changed, so the nodes' clocks need not agree. Checkpoints
live on the shared filesystem, so a rerun resumes from the last one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.launch.processes import die_with_parent, kill_group
from pipeline.store.home import home
from pipeline.store.locks import held, lock_path
from stages.launch import LaunchSpec
from toolkit.core.files import write_json_atomic

HEARTBEAT_S = 1.0


def nodes_dir() -> Path:
    return home() / "nodes"


def deepspeed_command(spec_path: Path | str, hostfile: Path | str, master_addr: str, master_port: int,
                      node_rank: int | None = None) -> list[str]:
    """DeepSpeed's launcher over a hostfile: with `node_rank`, this node's ranks only (`--no_ssh`);
    without, every node's, started over ssh (pdsh) from here."""
    cmd = [str(Path(sys.executable).parent / "deepspeed"), "--hostfile", str(hostfile)]
    if node_rank is not None:
        cmd += ["--no_ssh", "--node_rank", str(node_rank)]
    return cmd + ["--master_addr", master_addr, "--master_port", str(master_port),
                  "--module", "pipeline.worker", str(spec_path)]


def write_hostfile(hosts: list[tuple[str, int]], path: Path) -> Path:
    path.write_text("".join(f"{h} slots={s}\n" for h, s in hosts))
    return path


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Liveness:
    """When each report last changed, by this process's clock."""

    def __init__(self):
        self._seen: dict[str, tuple[int, float]] = {}

    def silent_for(self, key: str, beat: int) -> float:
        last = self._seen.get(key)
        if last is None or last[0] != beat:
            self._seen[key] = (beat, time.monotonic())
            return 0.0
        return time.monotonic() - last[1]


# --- head node ---------------------------------------------------------------------------------

class Posted:
    """A launch the head has posted: its heartbeat, and its view of the other nodes' reports."""

    def __init__(self, record: dict, nodes: int, timeout_s: float):
        self.record, self.nodes, self.timeout_s = record, nodes, timeout_s
        self.started, self.liveness, self.beat = time.monotonic(), Liveness(), 0

    def heartbeat(self, state: str = "running") -> None:
        self.beat += 1
        write_json_atomic(nodes_dir() / "launch.json", {**self.record, "state": state, "beat": self.beat})

    def problem(self) -> str | None:
        """Why the stage cannot go on (a node failed, never joined, or fell silent), or None."""
        for rank in range(1, self.nodes):
            report = _read(nodes_dir() / f"node-{rank}.json")
            if report is None or report.get("launch") != self.record["id"]:
                if time.monotonic() - self.started > self.timeout_s:
                    return (f"node {rank} has not joined after {self.timeout_s:.0f} s: is `posttrain node --rank "
                            f"{rank}` running there, with POSTTRAIN_HOME={home()} on a shared filesystem?")
                continue
            if report["state"] == "exited" and report["returncode"] != 0:
                return f"node {rank}'s launcher exited with code {report['returncode']}; its log: {report['log']}"
            if report["state"] == "running" and \
                    self.liveness.silent_for(str(rank), report["beat"]) > self.timeout_s:
                return f"node {rank} has not reported for {self.timeout_s:.0f} s (node lost?); its log: {report['log']}"
        return None


@contextmanager
def posted_launch(spec_path: Path, hostfile: Path, launch: LaunchSpec, master_addr: str, env: dict[str, str],
                  nodes: int) -> Iterator[Posted]:
    """Post a multi-node stage for the follower nodes, for as long as the head runs it. One
    multi-node stage at a time per POSTTRAIN_HOME: a second one waits for the lock."""
    def waiting(holder: str) -> None:
        print(f"posttrain: another multi-node stage (pid {holder}) holds the nodes; waiting for it", flush=True)

    with held(lock_path("nodes", "launch"), on_wait=waiting):
        record = {"id": uuid.uuid4().hex, "spec": str(spec_path), "hostfile": str(hostfile), "nodes": nodes,
                  "master_addr": master_addr, "master_port": launch.master_port, "env": env,
                  "log_dir": str(spec_path.parent), "timeout_s": launch.node_timeout_s}
        posted = Posted(record, nodes, launch.node_timeout_s)
        posted.heartbeat()
        ok = False
        try:
            yield posted
            ok = True
        finally:
            posted.heartbeat("done" if ok else "withdrawn")  # followers stop their ranks on "withdrawn"


# --- follower nodes ----------------------------------------------------------------------------

def report(rank: int, launch_id: str, state: str, beat: int, log: Path, returncode: int | None = None) -> None:
    write_json_atomic(nodes_dir() / f"node-{rank}.json", {"launch": launch_id, "state": state, "beat": beat,
                                                          "pid": os.getpid(), "log": str(log), "returncode": returncode})


def join(record: dict, rank: int) -> int:
    """Run this node's ranks of a posted launch; returns the launcher's exit code."""
    log = Path(record["log_dir"]) / f"worker-node{rank}.log"
    cmd = deepspeed_command(record["spec"], record["hostfile"], record["master_addr"], record["master_port"], rank)
    # the ranks watch this process, not the head's flow pid, which does not exist on this machine
    env = {**os.environ, **record["env"], "POSTTRAIN_WATCH_PID": str(os.getpid())}
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=die_with_parent)
    liveness, beat, reason = Liveness(), 0, None
    try:
        while proc.poll() is None:
            beat += 1
            report(rank, record["id"], "running", beat, log)
            now = _read(nodes_dir() / "launch.json") or {}
            if now.get("id") != record["id"] or now.get("state") == "withdrawn":
                reason = "the head withdrew the stage"
            elif liveness.silent_for("head", now.get("beat", 0)) > record["timeout_s"]:
                # a head that finished ("done") stops beating too: this node's ranks had that long to exit
                reason = f"the head has not reported for {record['timeout_s']} s"
            if reason:
                kill_group(proc)
                break
            time.sleep(HEARTBEAT_S)
    finally:
        kill_group(proc)
    code = proc.returncode if not reason else 1
    report(rank, record["id"], "exited", beat + 1, log, code)
    print(f"posttrain node {rank}: stage {Path(record['log_dir']).name} ended: "
          f"{reason or f'launcher exit code {code}'}; log {log}", flush=True)
    return code


def follow(rank: int, once: bool = False, poll_s: float = HEARTBEAT_S) -> int:
    """Join every stage the head posts, until killed (or after one with `once`)."""
    if rank < 1:
        raise ValueError("node rank 0 is the head: it runs `posttrain run`; followers are 1, 2, ...")
    joined: set[str] = set()
    print(f"posttrain node {rank}: waiting for stages posted in {nodes_dir()}", flush=True)
    while True:
        record = _read(nodes_dir() / "launch.json")
        if record and record.get("state") == "running" and record["id"] not in joined:
            if rank >= record["nodes"]:
                raise SystemExit(f"posttrain node {rank}: the posted stage has only {record['nodes']} nodes")
            joined.add(record["id"])
            print(f"posttrain node {rank}: joining {record['spec']}", flush=True)
            code = join(record, rank)
            if once:
                return code
        time.sleep(poll_s)
