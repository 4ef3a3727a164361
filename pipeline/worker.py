"""The process a stage runs in: `python -m pipeline.worker SPEC.json` (or one per rank under
`deepspeed`). It trains, evaluates on rank 0 when the plan says so, streams step metrics to the
MLflow run the spec names (through pipeline.tracking.mlflow_runs), and writes result.json (a StageOutput) into
the stage's still partial output directory; the flow logs that output to MLflow. A stage without a
trainer (data curation) never imports MLflow or torch here. The spec is a WorkerSpec
(stages.contracts) written by the flow.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from pipeline.launch.processes import die_with_parent
from pipeline.store.home import home
from pipeline.tracking import mlflow_runs
from stages.common import TrainingKnobs
from stages.contracts import StageOutput, WorkerSpec
from stages.evaluate import EVAL_SCORES, INPUT_EVAL_SCORES, EvalSpec, evaluate, evaluate_once
from stages.registry import STAGE_KINDS
from stages.runtime import StageContext, baseline_cache, load_stage_rows
from toolkit.core.files import write_json_atomic
from toolkit.rollouts.engines import drain_opened, keep_conversions_in


def watch_flow(pid: int | None, every_s: float = 2.0) -> None:
    """Kill this worker's whole process group once the flow process that launched it is gone.

    PR_SET_PDEATHSIG covers direct children only; under DeepSpeed the ranks are grandchildren of
    the flow, so each rank also watches the flow's pid.
    """
    if not pid:
        return

    def loop():
        while True:
            time.sleep(every_s)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=loop, daemon=True, name="watch-flow").start()


def run_spec(spec: WorkerSpec) -> StageOutput | None:
    """Train and evaluate one stage; returns its output on rank 0 (None on other ranks)."""
    kind = STAGE_KINDS[spec.kind]
    cfg = kind.config.model_validate(spec.stage)
    run_id = spec.mlflow_run_id
    spool = Path(spec.output_dir) / mlflow_runs.SPOOL
    ctx = StageContext(spec=spec, make_callbacks=lambda: [mlflow_runs.step_logger(run_id, spool)] if run_id else [])
    if isinstance(cfg, TrainingKnobs):
        # A training stage's process seeds itself from the stage's seed before any weight is made: a
        # reward model's score head and LoRA's A matrices are drawn as the model is built, before the
        # trainer seeds. (Data stages import no torch at all.)
        from transformers import set_seed

        set_seed(cfg.seed)
    started = time.time()
    output = kind.run(cfg, ctx)
    if not ctx.is_main:
        return None
    output.metrics["train/seconds"] = time.time() - started
    output.metrics.update(ctx.metrics)
    table = None
    if spec.eval is not None:  # decided by the plan, once
        rows = load_stage_rows(spec.inputs["eval_data"])
        done = evaluate(str(ctx.output_dir / output.outputs["model"]), EvalSpec.model_validate(spec.eval),
                        rows, getattr(cfg, "trust_remote_code", False), ctx.output_dir)
        output.metrics.update(done.metrics)
        table = done.table
        write_json_atomic(ctx.output_dir / EVAL_SCORES, done.scores)  # for paired comparisons (pipeline.gates)
        if spec.baseline:  # the input model, measured once per model and eval spec (pipeline.gates)
            before = evaluate_once(spec.inputs[spec.baseline["input"]], EvalSpec.model_validate(spec.baseline["eval"]), rows,
                                   getattr(cfg, "trust_remote_code", False), baseline_cache(ctx))
            output.metrics.update({f"input/{k}": v for k, v in before.metrics.items()})
            write_json_atomic(ctx.output_dir / INPUT_EVAL_SCORES, before.scores)
        if (ctx.output_dir / "budget_curve.png").exists():
            output.artifacts.append("budget_curve.png")
        write_json_atomic(ctx.output_dir / "eval_samples.json", table)
    if engines := drain_opened():  # what sampled, as it ran: `auto` resolved, precision, thread budget
        output.tags[mlflow_runs.GENERATION_TAG] = "; ".join(engines)
    if output.tags.get(mlflow_runs.SANDBOX_TAG) == "unsandboxed":
        print("posttrain: WARNING: this stage ran model-written code without a sandbox (allow_unsandboxed)", flush=True)
    write_json_atomic(ctx.output_dir / "result.json", output.model_dump())
    return output


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = [a for a in argv if not a.startswith("--local_rank")]  # the DeepSpeed launcher adds it
    die_with_parent()
    spec = WorkerSpec.model_validate_json(Path(args[0]).read_text())
    keep_conversions_in(home() / "cache")  # as configure_environment does in the flow's process
    # a follower node's ranks watch its `posttrain node` (the head's flow pid is on another machine)
    watch_flow(int(os.environ.get("POSTTRAIN_WATCH_PID") or spec.flow_pid or 0))
    if spec.deepspeed_config:
        skip_deepspeed_shm_kernel()
    try:
        join_process_group()
        run_spec(spec)
    finally:
        close_process_group()
    return 0


def skip_deepspeed_shm_kernel() -> None:
    """Keep DeepSpeed from JIT-building its CPU shared-memory all-reduce kernel (deepspeed_shm_comm).

    Only `inference_all_reduce` (tensor-parallel inference) calls that kernel; training never does,
    and without it DeepSpeed falls back to the process group. Loading it is not free on a CPU
    machine: every new DeepSpeed install path rebuilds it (~25 s on 2 cores) in the machine-wide
    ~/.cache/torch_extensions, and torch guards that build with a lock *file*. A rank killed while
    holding it (a run stopped as it starts) leaves the file behind, and every later DeepSpeed run on
    the machine then waits on it forever; a CI run hung 900 s on exactly that. On GPU machines
    DeepSpeed does not build this kernel, so this changes nothing there.
    """
    import importlib

    # not `import deepspeed.comm.torch as m`: deepspeed.comm binds the name `torch` to torch itself
    backend = importlib.import_module("deepspeed.comm.torch")
    backend.build_shm_op = lambda: None  # TorchBackend.__init__ looks the name up at call time


def join_process_group() -> None:
    """Under the DeepSpeed launcher, join the ranks' process group before any model is built:
    ZeRO-3 partitions weights while loading them (zero.Init) and must know the world size then;
    the trainer would only join later, and each rank would take itself for the whole world."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import deepspeed
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


def close_process_group() -> None:
    """Tear this rank's process group down before the interpreter exits.

    Without it a rank that finishes first (every rank but 0 skips saving and evaluation) exits with
    the group's communication threads still running, and the C++ runtime can abort it at exit
    ("terminate called without an active exception", SIGABRT), failing a stage that succeeded.
    No barrier: rank 0 may evaluate for longer than the collective timeout.
    """
    dist = sys.modules.get("torch.distributed")  # not imported: no group to close (a data stage)
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
