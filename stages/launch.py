"""How a stage's worker is launched: one process, N DeepSpeed ranks, many nodes, and a vLLM rollout
server beside the trainer. A plain config; `pipeline.launch.workers` and `pipeline.launch.nodes` act on it."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

HOST_LINE = re.compile(r"^\s*(?P<host>[^\s#]+)\s+slots=(?P<slots>\d+)\s*(#.*)?$")


def _numeric(annotation) -> bool:
    """Whether a field takes a number (int or float, optional or not) and not a bool."""
    if annotation in (int, float):
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return _numeric(args[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return bool not in args and any(_numeric(a) for a in args)
    return False


class Strict(BaseModel):
    """Every config: unknown fields refused, and no `true` where a number belongs (pydantic would
    read `max_steps: true` as 1)."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bools_for_numbers(cls, value):
        if isinstance(value, dict):
            for name, field in cls.model_fields.items():
                given = value.get(field.alias or name, value.get(name))
                if isinstance(given, bool) and _numeric(field.annotation):
                    raise ValueError(f"{field.alias or name} is a number, not {str(given).lower()}")
        return value


class RolloutServer(Strict):
    """TRL's vLLM server mode (`trl vllm-serve`): the server takes the first `gpus` GPUs of the head
    node, the trainer's ranks the GPUs after them. The launcher starts it, waits for its health
    check, runs the stage and stops it; its log is `vllm_server.log` beside the stage's."""
    gpus: int = Field(1, ge=1, description="GPUs for the server (tensor x data parallel)")
    tensor_parallel_size: int | None = Field(None, ge=1, description="default: all of the server's GPUs")
    host: str = Field("127.0.0.1", description="the address the server binds to and the trainer calls")
    port: int = Field(8000, ge=1, le=65535)
    startup_timeout_s: int = Field(900, ge=1, description="fail the stage when /health does not answer by then")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    extra_args: list[str] = Field(default_factory=list, description="more `trl vllm-serve` flags")

    @model_validator(mode="after")
    def _parallel_fits(self):
        tp = self.tensor_parallel_size or self.gpus
        if self.gpus % tp:
            raise ValueError(f"tensor_parallel_size {tp} does not divide the server's {self.gpus} GPUs")
        return self


class LaunchSpec(Strict):
    """How a stage's worker runs.

    `subprocess` runs one worker process; `deepspeed` runs `ranks` workers under the DeepSpeed
    launcher with the ZeRO config named by `deepspeed_config` (a file in infra/deepspeed/ without
    `.json`, or a path); `inprocess` runs inside the flow's process (quick, but cannot be killed
    separately and gives no crash isolation).

    Multi-node (`nodes`: a DeepSpeed hostfile, or its `host slots=N` lines): DeepSpeed's own launch
    over ssh (pdsh) from the head node; or, with `no_ssh` (Kubernetes, SLURM), the head runs node 0
    and every other node runs `posttrain node --rank N`, which joins each stage the head posts in
    `$POSTTRAIN_HOME/nodes/` (a filesystem all nodes share). Each host's slots are its ranks.
    """
    mode: Literal["subprocess", "deepspeed", "inprocess"] = "subprocess"
    ranks: int = Field(1, ge=1, le=64, description="ranks on this node (with `nodes`: each host's slots)")
    deepspeed_config: str = "zero2"
    timeout_s: int | None = Field(None, ge=1, description="kill the stage after this many seconds")
    nodes: str | list[str] | None = Field(None, description="multi-node: a hostfile path, or `host slots=N` lines")
    no_ssh: bool = Field(False, description="each node runs its own launcher (`posttrain node --rank N`)")
    master_addr: str | None = Field(None, description="rendezvous address; default: the first host")
    master_port: int = Field(29500, ge=1, le=65535)
    node_timeout_s: int = Field(120, ge=5, description="no_ssh: fail the stage when a node has not joined, or "
                                "has stopped reporting, for this long")
    gpus_per_node: int | None = Field(None, ge=1, description="checked against ranks plus the rollout server's GPUs")
    rollout_server: RolloutServer | None = Field(None, description="a `trl vllm-serve` for `rollout: vllm_server`")

    @model_validator(mode="after")
    def _consistent(self):
        if self.ranks > 1 and self.mode != "deepspeed":
            raise ValueError(f"ranks={self.ranks} needs mode: deepspeed")
        if self.nodes is not None:
            if self.mode != "deepspeed":
                raise ValueError("nodes: multi-node stages run under mode: deepspeed")
            if self.ranks > 1:
                raise ValueError("with nodes, each host's slots are its ranks; remove ranks")
            if isinstance(self.nodes, list):
                parse_host_lines(self.nodes, "nodes")
            if self.rollout_server is not None:
                raise ValueError("a rollout server runs beside a single-node trainer; nodes and rollout_server "
                                 "cannot be combined yet")
        elif self.no_ssh:
            raise ValueError("no_ssh applies to a multi-node launch: set nodes")
        if self.rollout_server and self.mode == "inprocess":
            raise ValueError("a rollout server runs beside a worker process: use mode subprocess or deepspeed")
        if self.rollout_server and self.gpus_per_node and self.ranks + self.rollout_server.gpus > self.gpus_per_node:
            raise ValueError(f"the rollout server's {self.rollout_server.gpus} GPU(s) plus {self.ranks} trainer "
                             f"rank(s) exceed gpus_per_node {self.gpus_per_node}")
        return self


def parse_host_lines(lines: list[str], where: str) -> list[tuple[str, int]]:
    """(host, slots) from DeepSpeed hostfile lines; comments and blank lines are skipped."""
    hosts: list[tuple[str, int]] = []
    for i, line in enumerate(lines):
        if not line.strip() or line.strip().startswith("#"):
            continue
        m = HOST_LINE.match(line)
        if not m or int(m["slots"]) < 1:
            raise ValueError(f"{where}[{i}]: {line.strip()!r} is not a hostfile line `<host> slots=<N>`")
        if m["host"] in {h for h, _ in hosts}:
            raise ValueError(f"{where}[{i}]: host {m['host']!r} is listed twice")
        hosts.append((m["host"], int(m["slots"])))
    if not hosts:
        raise ValueError(f"{where}: no hosts")
    return hosts


def host_slots(launch: LaunchSpec) -> list[tuple[str, int]]:
    """The launch's hosts and slots; a hostfile path is read relative to the working directory
    (recipe validation reads it once and replaces it by its lines)."""
    if isinstance(launch.nodes, list):
        return parse_host_lines(launch.nodes, "nodes")
    path = Path(launch.nodes or "")
    if not path.is_file():
        raise ValueError(f"no hostfile at {path.resolve()}")
    return parse_host_lines(path.read_text().splitlines(), str(path))


def launch_key(launch: LaunchSpec) -> dict:
    """What of a launch shapes a stage's result, for its cache key: the mode, the ZeRO config and the
    ranks on each node. Addresses, ports, host names and timeouts are plumbing: a rerun on other pods
    or another port must find the same output and resume it. `inprocess` keys as `subprocess`: both
    run the same worker code in one process, so either finds the other's output."""
    world = [launch.ranks] if launch.nodes is None else [slots for _, slots in host_slots(launch)]
    server = launch.rollout_server
    mode = "subprocess" if launch.mode == "inprocess" else launch.mode
    return {"mode": mode, "deepspeed_config": launch.deepspeed_config, "world": world,
            "rollout_server": server and server.model_dump(include={"gpus", "tensor_parallel_size", "extra_args"})}
