"""What every trainer-backed stage needs inside its worker: where to write, which rank it is, how
to resume, how to report progress, and how to save a model the next stage can load."""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from data_curation.mixture import mix_rows
from data_curation.ngrams import normalize
from data_curation.preferences import load_pairs
from data_curation.schema import check_row
from data_curation.sources import load_rows
from stages.contracts import WorkerSpec
from toolkit.core.files import corrupt_files, quarantine, write_json_atomic, write_manifest
from toolkit.core.loading import whole_model
from toolkit.core.text import question_text


@dataclass
class StageContext:
    """What a kind's `run` gets besides its config: the worker spec (inputs, output directory),
    extra metrics to report, and trainer callbacks from the worker (its MLflow step logger)."""
    spec: WorkerSpec
    metrics: dict = field(default_factory=dict)  # extra metrics the worker adds to the stage's result
    # built on first use: a trainer callback imports transformers (with peft, ~3 s), which a data
    # stage would otherwise pay for nothing
    make_callbacks: Callable[[], list] = list

    @functools.cached_property
    def callbacks(self) -> list:
        return self.make_callbacks()

    @property
    def output_dir(self) -> Path:
        return Path(self.spec.output_dir)

    @property
    def rank(self) -> int:
        return int(os.environ.get("RANK", "0"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"

    def input(self, name: str):
        return self.spec.inputs[name]

    @classmethod
    def local(cls, output_dir: Path, inputs: dict | None = None, kind: str = "") -> StageContext:
        """A context for running a kind by hand (tests, notebooks): no MLflow, no evaluation."""
        return cls(WorkerSpec(kind=kind, stage={}, inputs=inputs or {}, eval=None, output_dir=str(output_dir)))


def load_stage_rows(data: dict, ctx: StageContext | None = None) -> list[dict]:
    """Rows for a DataSpec as the flow resolved it: either {"path": jsonl} (an earlier stage's
    output) or a source spec. Rows skipped under `on_bad_rows: skip` are counted in the stage's
    metrics (`data/skipped_rows`) and the first few reasons printed to the worker log."""
    if "path" in data:
        rows = []
        with open(data["path"]) as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    row = json.loads(line)
                    check_row(row, f"{data['path']}:{i}")
                    rows.append(row)
        return rows[: data["n"]] if data.get("n") else rows
    skipped: list[str] = []
    rows = load_rows(data["source"], data.get("split", "train"), data.get("n"), data.get("seed", 0),
                     data.get("params"), on_bad_rows=data.get("on_bad_rows", "fail"), skipped=skipped)
    if skipped:
        print(f"posttrain: skipped {len(skipped)} bad rows of {data['source']}, e.g. {skipped[:3]}", flush=True)
    if ctx is not None:
        ctx.metrics["data/skipped_rows"] = ctx.metrics.get("data/skipped_rows", 0.0) + len(skipped)
    return rows



def excluded_questions(cfg, ctx: StageContext) -> set[str]:
    """The normalised questions of the config's `exclude` datasets."""
    return {normalize(question_text(r)) for i in range(len(cfg.exclude))
            for r in load_stage_rows(ctx.input(f"exclude.{i}"), ctx)}


def without(rows: list[dict], questions: set[str], ctx: StageContext) -> list[dict]:
    """`rows` less those asking one of `questions` (counted in `data/excluded_rows`)."""
    if not questions:
        return rows
    kept = [r for r in rows if normalize(question_text(r)) not in questions]
    ctx.metrics["data/excluded_rows"] = ctx.metrics.get("data/excluded_rows", 0.0) + len(rows) - len(kept)
    return kept


def training_rows(cfg, ctx: StageContext, what: str) -> tuple[list[dict], list[dict] | None]:
    """The rows of a DataOrMix config (less its `exclude` datasets' questions) and, for a mixture,
    the composition actually used."""
    excluded = excluded_questions(cfg, ctx)
    if not cfg.mix:
        return without(load_stage_rows(ctx.input("data"), ctx), excluded, ctx), None
    parts = [(part.data.source, without(load_stage_rows(ctx.input(f"mix.{i}.data"), ctx), excluded, ctx),
              part.count, part.weight, part.ratio) for i, part in enumerate(cfg.mix)]
    rows, composition = mix_rows(parts, cfg.mix_seed)
    print(f"posttrain: {what} mixture " + ", ".join(f"{c['part']}: {c['used']} rows ({c['share']:.0%})"
                                                   for c in composition), flush=True)
    return rows, composition


def baseline_cache(ctx: StageContext) -> Path | None:
    """Where the plan caches this stage's input-model evaluation (pipeline.gates), if it asks for one."""
    return Path(ctx.spec.baseline["path"]) if ctx.spec.baseline else None


def record_mixture(composition: list[dict] | None, ctx: StageContext) -> tuple[dict[str, float], list[str]]:
    """(metrics, artifacts) describing a mixture: mixture.json and rows/share per part."""
    if not composition:
        return {}, []
    write_json_atomic(ctx.output_dir / "mixture.json", composition)
    metrics = {}
    for i, part in enumerate(composition):
        metrics.update({f"mix/{i}/rows": float(part["used"]), f"mix/{i}/share": part["share"]})
    return metrics, ["mixture.json"]

def load_stage_pairs(data: dict) -> list[dict]:
    """Preference pairs for a resolved pairs input: an earlier stage's pairs.jsonl or a local file."""
    if "path" in data:
        return load_pairs(data["path"], n=data.get("n"))
    params = data.get("params") or {}
    return load_pairs(params["path"], params.get("columns"), data.get("n"))


def last_checkpoint(ctx: StageContext) -> str | None:
    """The newest whole checkpoint. HF writes trainer_state.json last (and not atomically), so a
    checkpoint without it, or with one that does not parse, was cut short by a crash mid-save:
    removed. Every checkpoint gets a checksum manifest right after it is saved (progress_callback),
    so one whose files were truncated, zeroed or lost since is moved aside
    (`checkpoint-N.corrupt-<time>`, named in a warning) and the one before it resumed from. A
    checkpoint without a manifest (killed before it was written, or written before manifests
    existed) is taken as it is when its trainer state parses."""
    import shutil

    complete, cut_short = saved_checkpoints(ctx.checkpoint_dir)
    if ctx.is_main:
        for p in cut_short:
            print(f"posttrain: removing incomplete checkpoint {p}", flush=True)
            shutil.rmtree(p, ignore_errors=True)
    for p in reversed(complete):
        bad = corrupt_files(p)
        # a checkpoint gone since the glob was moved aside by the main rank, which reached the same
        # verdict (without its manifest it would read as an old checkpoint, taken as it is)
        if not bad and p.is_dir():
            print(f"posttrain: resuming from {p}", flush=True)
            return str(p)
        why = "; ".join(bad) or "moved aside by the main rank"
        print(f"posttrain: WARNING: checkpoint {p} is corrupt ({why}); moved aside, trying the one before it", flush=True)
        if ctx.is_main:  # every rank reaches the same verdict; one moves it
            quarantine(p)
    return None


def saved_checkpoints(checkpoint_dir: Path) -> tuple[list[Path], list[Path]]:
    """The `checkpoint-N` folders under `checkpoint_dir`, oldest first, as (whole, cut short): one
    whose trainer state does not parse was cut short mid-save. Reads only; last_checkpoint acts on it."""
    found = sorted((p for p in checkpoint_dir.glob("checkpoint-*") if p.name.removeprefix("checkpoint-").isdigit()),
                   key=lambda p: checkpoint_step(str(p)))
    whole = [p for p in found if state_written(p)]
    return whole, [p for p in found if p not in whole]


def state_written(checkpoint: Path) -> bool:
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def checkpoint_step(path: str | None) -> int:
    return int(Path(path).name.split("-")[-1]) if path else 0


def trainer_args(cfg, ctx: StageContext) -> dict:
    """TrainingArguments fields that come straight from the shared knobs and the context."""
    import torch

    return dict(
        output_dir=str(ctx.checkpoint_dir), max_steps=cfg.max_steps, learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler, warmup_steps=cfg.warmup_ratio,  # < 1 means a share of steps
        weight_decay=cfg.weight_decay,
        per_device_train_batch_size=cfg.per_device_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, save_steps=cfg.save_steps,
        save_total_limit=2, logging_steps=cfg.logging_steps, seed=cfg.seed, bf16=cfg.bf16,
        gradient_checkpointing=cfg.gradient_checkpointing, use_cpu=not torch.cuda.is_available(),
        report_to=[], deepspeed=ctx.spec.deepspeed_config,  # step metrics go through ctx.callbacks
        disable_tqdm=False, dataloader_num_workers=0, save_only_model=False,
    )


def progress_callback(ctx: StageContext):
    """A TrainerCallback that writes progress.json (the launcher turns it into a Prefect artifact)
    and each checkpoint's checksum manifest."""
    from transformers import TrainerCallback

    class WriteProgress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero:
                write_json_atomic(ctx.output_dir / "progress.json",
                                  {"step": state.global_step, "max_steps": state.max_steps, "logs": logs or {}})

        def on_save(self, args, state, control, **kwargs):
            """The checkpoint just written gets its checksum manifest (checked before resuming)."""
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.barrier()  # every rank has written its shards and RNG state before they are hashed
            saved = ctx.checkpoint_dir / f"checkpoint-{state.global_step}"
            if state.is_world_process_zero and saved.is_dir():
                write_manifest(saved)

    return WriteProgress()


def lora_config(cfg):
    if cfg.lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                      target_modules=cfg.lora.target_modules, task_type="CAUSAL_LM")


def save_model(trainer, tokenizer, ctx: StageContext) -> Path:
    """Save full weights (LoRA adapters merged) and the tokenizer to <output>/model."""
    out = ctx.output_dir / "model"
    if hasattr(trainer.model, "merge_and_unload"):  # downstream stages want a plain model, not adapters
        # Under ZeRO-3 each rank holds a shard of every weight, so the adapters cannot be merged in
        # place: the trainer gathers and saves them (all ranks), then rank 0 merges them into a fresh
        # copy of the input model.
        adapter = ctx.output_dir / "adapter"
        trainer.save_model(str(adapter))
        if ctx.is_main:
            from peft import AutoPeftModelForCausalLM

            with whole_model():
                merged = AutoPeftModelForCausalLM.from_pretrained(str(adapter), torch_dtype="auto")
            merged.merge_and_unload().save_pretrained(out)
            shutil.rmtree(adapter)
    else:
        trainer.save_model(str(out))
    if ctx.is_main:
        tokenizer.save_pretrained(out)
    return out


def train_metrics(trainer, resumed_from: str | None) -> dict:
    """Loss, steps and, where TRL counts them (`num_tokens`: prompt and completion tokens, padding
    excluded), tokens trained on and their rate over the trainer's own runtime. After a resume TRL's
    count includes the steps before it, so no rate is given then."""
    history = [h for h in trainer.state.log_history if "loss" in h]
    metrics = {"train/final_loss": history[-1]["loss"] if history else float("nan"),
               "train/first_loss": history[0]["loss"] if history else float("nan"),
               "train/global_step": float(trainer.state.global_step),
               "train/resumed_from_step": float(checkpoint_step(resumed_from))}
    tokens = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
    runtime = [h["train_runtime"] for h in trainer.state.log_history if "train_runtime" in h]
    if tokens:
        metrics["train/tokens"] = float(tokens[-1])
    if runtime:
        metrics["train/runtime_s"] = float(runtime[-1])
        if tokens and not resumed_from:
            metrics["train/tokens_per_second"] = float(tokens[-1]) / max(runtime[-1], 1e-9)
    return metrics
