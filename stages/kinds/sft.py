"""Stage kind `sft`: supervised fine-tuning with TRL's SFTTrainer (optionally LoRA via peft).

Used for R1's cold start (long-CoT traces), rejection-sampling SFT, Qwen3's thinking-mode fusion and
off-policy distillation. Each row is trained as a prompt/completion pair, with the loss on the
completion only: the prompt is the row's chat messages, the completion its `solution`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from stages.kinds.common import DataSpec, StageBase, TrainingKnobs
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


class SFTConfig(StageBase, TrainingKnobs):
    kind: Literal["sft"] = "sft"
    model: str = Field(description="base model: profile alias, named model, path, hub id or `stage.model`")
    data: DataSpec
    learning_rate: float = Field(2e-5, gt=0)

    OUTPUTS: ClassVar[tuple[str, ...]] = ("model",)
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = ("model",)
    DATA_FIELDS: ClassVar[tuple[str, ...]] = ("data",)


def to_prompt_completion(rows: list[dict]) -> list[dict]:
    missing = [r["id"] for r in rows if not r.get("solution")]
    if missing:
        raise ValueError(f"sft needs a `solution` on every row; {len(missing)} rows lack one, e.g. {missing[:3]}")
    return [{"prompt": r["prompt"], "completion": [{"role": "assistant", "content": r["solution"]}]} for r in rows]


def run(cfg: SFTConfig, ctx) -> StageOutput:
    from datasets import Dataset
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer


    model_dir = ctx.input("model")
    tokenizer = load_tokenizer(model_dir, cfg.trust_remote_code)
    train = Dataset.from_list(to_prompt_completion(load_stage_rows(ctx.input("data"), ctx)))
    args = TRLSFTConfig(**trainer_args(cfg, ctx), max_length=cfg.max_length, completion_only_loss=True,
                        model_init_kwargs={"trust_remote_code": cfg.trust_remote_code})
    trainer = SFTTrainer(model=model_dir, args=args, train_dataset=train, processing_class=tokenizer,
                         peft_config=lora_config(cfg), callbacks=[progress_callback(ctx), *ctx.callbacks])
    resume = last_checkpoint(ctx)
    trainer.train(resume_from_checkpoint=resume)
    save_model(trainer, tokenizer, ctx)
    return StageOutput(outputs={"model": "model"}, metrics={**train_metrics(trainer, resume), "train/rows": float(len(train))})
