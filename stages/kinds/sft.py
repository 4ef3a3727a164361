"""Stage kind `sft`: supervised fine-tuning with TRL's SFTTrainer (optionally LoRA via peft).

Used for R1's cold start (long-CoT traces), rejection-sampling SFT, Qwen3's thinking-mode fusion and
off-policy distillation. Each row is trained as a prompt/completion pair, with the loss on the
completion only: the prompt is the row's chat messages, the completion its `solution`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from data_curation.mixture import mix_rows
from stages.core.files import write_json_atomic
from stages.kinds.common import DataSpec, StageBase, Strict, TrainingKnobs
from stages.kinds.contracts import StageOutput
from stages.kinds.runtime import (
    last_checkpoint,
    load_stage_rows,
    lora_config,
    progress_callback,
    save_model,
    train_metrics,
    trainer_args,
)
from stages.rollouts import load_tokenizer


class MixPart(Strict):
    """One dataset of an SFT mixture, with how many of its rows to use."""
    data: DataSpec
    count: int | None = Field(None, ge=1, description="exactly this many rows (repeating rows if it has fewer)")
    weight: float | None = Field(None, gt=0, description="this multiple of its rows: 0.5 = half, 2 = each twice")

    @model_validator(mode="after")
    def _one_size(self):
        if self.count is not None and self.weight is not None:
            raise ValueError("give a part either a count or a weight, not both")
        return self


class SFTConfig(StageBase, TrainingKnobs):
    kind: Literal["sft"] = "sft"
    model: str = Field(description="base model: profile alias, named model, path, hub id or `stage.model`; "
                       "`base` retrains the profile's base model after other stages (R1 stage 3)")
    data: DataSpec | None = Field(None, description="one dataset; or use `mix`")
    mix: list[MixPart] = Field(default_factory=list, description="several datasets with a count or weight each")
    mix_seed: int = 0
    learning_rate: float = Field(2e-5, gt=0)

    OUTPUTS: ClassVar[tuple[str, ...]] = ("model",)
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = ("model",)
    DATA_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    @model_validator(mode="after")
    def _data_or_mix(self):
        if (self.data is None) == (not self.mix):
            raise ValueError("give exactly one of `data` (one dataset) and `mix` (several)")
        return self

    def data_inputs(self) -> dict[str, DataSpec]:
        if self.mix:
            return {f"mix.{i}.data": part.data for i, part in enumerate(self.mix)}
        return super().data_inputs()


def to_prompt_completion(rows: list[dict]) -> list[dict]:
    missing = [r["id"] for r in rows if not r.get("solution")]
    if missing:
        raise ValueError(f"sft needs a `solution` on every row; {len(missing)} rows lack one, e.g. {missing[:3]}")
    return [{"prompt": r["prompt"], "completion": [{"role": "assistant", "content": r["solution"]}]} for r in rows]


def run(cfg: SFTConfig, ctx) -> StageOutput:
    rows, composition = training_rows(cfg, ctx)
    metrics = train_on_rows(cfg, ctx, ctx.input("model"), rows)
    artifacts = []
    if composition:
        write_json_atomic(ctx.output_dir / "mixture.json", composition)
        artifacts.append("mixture.json")
        for i, part in enumerate(composition):
            metrics.update({f"mix/{i}/rows": float(part["used"]), f"mix/{i}/share": part["share"]})
    return StageOutput(outputs={"model": "model"}, metrics=metrics, artifacts=artifacts)


def train_on_rows(cfg, ctx, model_dir: str, rows: list[dict]) -> dict[str, float]:
    """Fine-tune `model_dir` on rows (prompt messages -> `solution`) into <output>/model; returns the
    training metrics. `cfg` is any config with the TrainingKnobs (SFT, off-policy distillation)."""
    from datasets import Dataset
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    tokenizer = load_tokenizer(model_dir, cfg.trust_remote_code)
    train = Dataset.from_list(to_prompt_completion(rows))
    args = TRLSFTConfig(**trainer_args(cfg, ctx), max_length=cfg.max_length, completion_only_loss=True,
                        model_init_kwargs={"trust_remote_code": cfg.trust_remote_code})
    trainer = SFTTrainer(model=model_dir, args=args, train_dataset=train, processing_class=tokenizer,
                         peft_config=lora_config(cfg), callbacks=[progress_callback(ctx), *ctx.callbacks])
    resume = last_checkpoint(ctx)
    trainer.train(resume_from_checkpoint=resume)
    save_model(trainer, tokenizer, ctx)
    return {**train_metrics(trainer, resume), "train/rows": float(len(train))}


def training_rows(cfg: SFTConfig, ctx) -> tuple[list[dict], list[dict] | None]:
    """The rows to train on and, for a mixture, the composition actually used."""
    if not cfg.mix:
        return load_stage_rows(ctx.input("data"), ctx), None
    parts = [(part.data.source, load_stage_rows(ctx.input(f"mix.{i}.data"), ctx), part.count, part.weight)
             for i, part in enumerate(cfg.mix)]
    rows, composition = mix_rows(parts, cfg.mix_seed)
    print("posttrain: SFT mixture " + ", ".join(f"{c['part']}: {c['used']} rows ({c['share']:.0%})"
                                                for c in composition), flush=True)
    return rows, composition
