"""Stage kind `sft`: supervised fine-tuning with TRL's SFTTrainer (optionally LoRA via peft).

Used for R1's cold start (long-CoT traces), rejection-sampling SFT, Qwen3's thinking-mode fusion and
off-policy distillation. Each row is trained as a prompt/completion pair, with the loss on the
completion only: the prompt is the row's chat messages, the completion its `solution`.

Ours, for speed, each the same numbers up to float rounding: padding-free batches where a one-layer
check allows (stages.padding_free); and on a CPU in float32, TRL's fused LM head answered by a dense
one that scores only the positions with a label (stages.dense_logps; `train/dense_lm_head`).
"""

from __future__ import annotations

import json
from typing import ClassVar, Literal

from pydantic import Field

from data_curation.fusion import NO_LOSS_PREFIX
from stages.common import DataOrMix, StageBase, TrainingKnobs
from stages.contracts import StageOutput
from stages.padding_free import padding_free_collator
from stages.runtime import (
    last_checkpoint,
    lora_config,
    progress_callback,
    record_mixture,
    save_model,
    train_metrics,
    trainer_args,
    training_rows,
)
from toolkit.rollouts import load_tokenizer


class SFTConfig(DataOrMix, StageBase, TrainingKnobs):
    kind: Literal["sft"] = "sft"
    model: str = Field(description="base model: profile alias, named model, path, hub id or `stage.model`; "
                       "`base` retrains the profile's base model after other stages (R1 stage 3)")
    learning_rate: float = Field(2e-5, gt=0)

    OUTPUTS: ClassVar[tuple[str, ...]] = ("model",)
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = ("model",)
    EVAL_INPUT: ClassVar[str | None] = "model"
    DATA_FIELDS: ClassVar[tuple[str, ...]] = ("data",)


def to_prompt_completion(rows: list[dict]) -> list[dict]:
    missing = [r["id"] for r in rows if not r.get("solution")]
    if missing:
        raise ValueError(f"sft needs a `solution` on every row; {len(missing)} rows lack one, e.g. {missing[:3]}")
    return [{"prompt": r["prompt"], "completion": [{"role": "assistant", "content": r["solution"]}]} for r in rows]


def _row_key(prompt: list[dict], completion: str) -> str:
    return json.dumps([[(m["role"], m["content"]) for m in prompt], completion])


def without_prefix_loss(dataset, rows: list[dict], tokenizer):
    """TRL's tokenized rows with the loss taken off each row's `no_loss_prefix` (labels -100): the
    opening of its completion that the model is not to learn (a thinking-fusion row's cut thought
    and the stop-thinking string a budget inserts at inference; data_curation/fusion.py). A token
    that straddles the prefix's end is masked too, and a row cut by `max_length` inside its prefix
    is dropped. A completion that does not start with its prefix (a chat template that rewrites the
    thinking) is an error, not a silent full loss."""
    # by prompt and completion, not by position: TRL drops rows that truncation left without a trained
    # token; and by both, because a hard-switch row has its /no_think twin's completion
    prefixes = {_row_key(r["prompt"], r["solution"]): (r["id"], r[NO_LOSS_PREFIX]) for r in rows if r.get(NO_LOSS_PREFIX)}
    if not prefixes:
        return dataset
    if not {"labels", "completion"} <= set(dataset.column_names):
        raise ValueError(f"no_loss_prefix needs TRL's labels beside each completion (columns {dataset.column_names})")

    def mask(example: dict) -> dict:
        if (found := prefixes.get(_row_key(example["prompt"], example["completion"][0]["content"]))) is None:
            return {}
        row_id, prefix = found
        ids, labels = example["input_ids"], list(example["labels"])
        start = next((j for j, label in enumerate(labels) if label != -100), None)
        if start is None:  # the prompt alone filled max_length: nothing is trained anyway
            return {}
        end = start + 1
        while end < len(ids) and len(tokenizer.decode(ids[start:end])) < len(prefix):
            end += 1
        seen = tokenizer.decode(ids[start:end])
        if not seen.startswith(prefix) and not (end == len(ids) and prefix.startswith(seen)):  # cut by max_length
            raise ValueError(f"row {row_id}: its tokenized completion does not start with its no_loss_prefix "
                             f"{prefix[:60]!r}... (the chat template changed it?)")
        labels[start:end] = [-100] * (end - start)
        return {"labels": labels}
    # as TRL does before: a row left without a trained token (cut by max_length inside its prefix) goes
    return dataset.map(mask).filter(lambda example: any(label != -100 for label in example["labels"]))


def run(cfg: SFTConfig, ctx) -> StageOutput:
    rows, composition = training_rows(cfg, ctx, "SFT")
    metrics = train_on_rows(cfg, ctx, ctx.input("model"), rows)
    mix_metrics, artifacts = record_mixture(composition, ctx)
    metrics.update(mix_metrics)
    return StageOutput(outputs={"model": "model"}, metrics=metrics, artifacts=artifacts)


def train_on_rows(cfg, ctx, model_dir: str, rows: list[dict]) -> dict[str, float]:
    """Fine-tune `model_dir` on rows (prompt messages -> `solution`) into <output>/model; returns the
    training metrics. `cfg` is any config with the TrainingKnobs (SFT, off-policy distillation)."""
    from datasets import Dataset
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    tokenizer = load_tokenizer(model_dir, cfg.trust_remote_code)
    train = Dataset.from_list(to_prompt_completion(rows))
    # before the config: ZeRO-3 would shard the check
    collator, attention = padding_free_collator(model_dir, cfg.trust_remote_code)
    args = TRLSFTConfig(**trainer_args(cfg, ctx), max_length=cfg.max_length, completion_only_loss=True,
                        model_init_kwargs={"trust_remote_code": cfg.trust_remote_code, **attention})
    trainer = SFTTrainer(model=model_dir, args=args, train_dataset=train, processing_class=tokenizer,
                         data_collator=collator, peft_config=lora_config(cfg), callbacks=[progress_callback(ctx), *ctx.callbacks])
    trainer.train_dataset = without_prefix_loss(trainer.train_dataset, rows, tokenizer)
    # TRL scores its loss with a fused LM head whose CPU fallback is slow and scores the prompts too
    from stages.dense_logps import answer_fused_head_densely  # here: a data stage's worker loads no torch

    model = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    dense_head = not (args.bf16 or args.fp16) and answer_fused_head_densely(model)
    if collator is not None:  # what TRL does to the model when it makes the collator itself
        trainer.model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
        trainer.model.generation_config.pad_token_id = tokenizer.pad_token_id
    resume = last_checkpoint(ctx)
    trainer.train(resume_from_checkpoint=resume)
    save_model(trainer, tokenizer, ctx)
    return {**train_metrics(trainer, resume), "train/rows": float(len(train)), "train/padding_free": float(collator is not None),
            "train/per_row_attention": float(bool(attention)), "train/dense_lm_head": float(dense_head)}
