"""Stage kind `reward_model`: a scalar reward model trained with TRL's RewardTrainer (Bradley-Terry
loss on chosen/rejected pairs) from a causal LM, which gets a fresh one-output score head.

A held-out share of the pairs (by a hash of each pair's id) is never trained on; the stage reports
pairwise accuracy on it (the chosen response scores higher) and the mean margin, and plots the
margins. Its `model` output is a sequence classifier: later stages use it as a reward
(`reward_model` in GRPO), not as a policy, so the recipe's generative evaluation is skipped.

It is trained on the view of each response it will score (`scope`): R1's helpfulness RM judges the
summary alone, so it learns from the summaries alone; a model trained on whole responses and applied
to summaries would score text unlike anything it saw. The scope is saved beside the weights
(`posttrain_reward_model.json`), the `reward_model` reward refuses another, and validation refuses a
recipe whose reward applies a stage's reward model with another scope.
"""

from __future__ import annotations

import hashlib
import json
from functools import partial
from typing import ClassVar, Literal

from pydantic import Field

from data_curation.report import plot_histogram
from stages.common import DataSpec, StageBase, TrainingKnobs
from stages.contracts import StageOutput
from stages.eval_modes import with_interval
from stages.padding_free import collate_flat_preferences, flat_reward_trainer, reward_padding_free
from stages.runtime import last_checkpoint, load_stage_pairs, progress_callback, train_metrics, trainer_args
from toolkit.core.stats import rate_interval
from toolkit.rewards.model_scored import SCOPE_FILE, load_reward_model, scoped, score


class RewardModelConfig(StageBase, TrainingKnobs):
    kind: Literal["reward_model"] = "reward_model"
    model: str = Field(description="the causal LM the reward model starts from (its head is new)")
    pairs: DataSpec = Field(description="preference pairs: a `preference_pairs` stage's `pairs` or a local file")
    eval_share: float = Field(0.1, gt=0, lt=1, description="pairs held out for pairwise accuracy")
    center_rewards_coefficient: float | None = Field(None, ge=0, description="TRL: pull mean reward to 0")
    scope: Literal["answer", "full"] = Field("full", description="the view of each response it learns to score: "
                                             "`answer` (after </think>; R1's helpfulness RM) or `full` (thinking "
                                             "included); a `reward_model` reward must apply it with the same scope")
    learning_rate: float = Field(1e-5, gt=0)
    evaluate: bool = False

    OUTPUTS: ClassVar[tuple[str, ...]] = ("model",)
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = ("model",)
    PAIRS_FIELDS: ClassVar[tuple[str, ...]] = ("pairs",)
    GENERATES: ClassVar[bool] = False


def held_out(pair_id: str, share: float) -> bool:
    return int(hashlib.sha256(pair_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def scoped_pairs(pairs: list[dict], scope: str) -> tuple[list[dict], int]:
    """The pairs as the reward model will see responses when it scores them (`scoped`): with scope
    answer, the text after the thinking. Pairs with a side that has no such view, or whose sides
    become equal, are dropped and counted."""
    out = []
    for p in pairs:
        chosen, rejected = scoped(p["chosen"], scope), scoped(p["rejected"], scope)
        if chosen and rejected and chosen != rejected:
            out.append({**p, "chosen": chosen, "rejected": rejected})
    return out, len(pairs) - len(out)


def as_conversations(pairs: list[dict]) -> list[dict]:
    """TRL's conversational preference format: the prompt as messages, each response as one turn."""
    return [{"prompt": p["prompt"], "chosen": [{"role": "assistant", "content": p["chosen"]}],
             "rejected": [{"role": "assistant", "content": p["rejected"]}]} for p in pairs]


def pairwise_accuracy(model_dir: str, pairs: list[dict], max_length: int) -> tuple[dict, list[float]]:
    model, tokenizer = load_reward_model(model_dir)
    prompts = [p["prompt"] for p in pairs]
    chosen = score(model, tokenizer, prompts, [p["chosen"] for p in pairs], max_length=max_length)
    rejected = score(model, tokenizer, prompts, [p["rejected"] for p in pairs], max_length=max_length)
    margins = [c - r for c, r in zip(chosen, rejected)]
    held = {"rm/margin_mean": sum(margins) / max(1, len(margins)), "rm/eval_pairs": float(len(margins))}
    # with its interval: a few held-out pairs on demo, and 0.44 on 9 says nothing alone
    with_interval(held, "rm/pairwise_accuracy", rate_interval([float(m > 0) for m in margins]))
    return held, margins


def run(cfg: RewardModelConfig, ctx) -> StageOutput:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, set_seed
    from trl import RewardConfig, RewardTrainer

    from toolkit.rollouts import load_tokenizer

    pairs, dropped = scoped_pairs(load_stage_pairs(ctx.input("pairs")), cfg.scope)
    if not pairs:
        raise ValueError(f"{cfg.name}: no preference pair differs in the {cfg.scope!r} view of its responses "
                         f"({dropped} dropped): with scope answer, pairs that differ only in the thinking teach nothing")
    train = [p for p in pairs if not held_out(p["id"], cfg.eval_share)]
    test = [p for p in pairs if held_out(p["id"], cfg.eval_share)]
    if not train or not test:
        raise ValueError(f"{len(pairs)} pairs give {len(train)} to train and {len(test)} to hold out; "
                         "reward-model training needs both")
    model_dir = ctx.input("model")
    tokenizer = load_tokenizer(model_dir, cfg.trust_remote_code)
    # before the trainer's config: under ZeRO-3 that would shard the check's model
    flat, attention = reward_padding_free(model_dir, cfg.trust_remote_code)
    set_seed(cfg.seed)  # the new score head's initial weights: from the stage's seed, not whatever ran before
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32,
                                                               trust_remote_code=cfg.trust_remote_code, **attention)
    model.config.pad_token_id = tokenizer.pad_token_id
    args = RewardConfig(**trainer_args(cfg, ctx), max_length=cfg.max_length,
                        center_rewards_coefficient=cfg.center_rewards_coefficient)
    trainer = (flat_reward_trainer() if flat else RewardTrainer)(
        model=model, args=args, train_dataset=Dataset.from_list(as_conversations(train)), processing_class=tokenizer,
        data_collator=partial(collate_flat_preferences, pad_token_id=tokenizer.pad_token_id) if flat else None,
        callbacks=[progress_callback(ctx), *ctx.callbacks])
    resume = last_checkpoint(ctx)
    trainer.train(resume_from_checkpoint=resume)
    out = ctx.output_dir / "model"
    trainer.save_model(str(out))
    metrics = {**train_metrics(trainer, resume), "train/pairs": float(len(train)),
               "train/pairs_dropped_by_scope": float(dropped), "train/padding_free": float(flat),
               "train/per_row_attention": float(bool(attention))}
    artifacts = []
    if ctx.is_main:  # only rank 0 holds the saved model folder
        tokenizer.save_pretrained(out)
        (out / SCOPE_FILE).write_text(json.dumps({"scope": cfg.scope}))  # RewardModelScore checks it
        held, margins = pairwise_accuracy(str(out), test, cfg.max_length)
        metrics.update(held)
        rate = "rm/pairwise_accuracy"
        accuracy = f"{held[rate]:.2f} [{held[rate + '_lo']:.2f}, {held[rate + '_hi']:.2f}], n = {len(margins)}"
        if held[rate + "_lo"] <= 0.5:
            print(f"posttrain: WARNING: {cfg.name}: held-out pairwise accuracy {accuracy} does not exclude chance: "
                  "the rewards this model gives are not shown to prefer the chosen responses", flush=True)
        plot_histogram(margins, ctx.output_dir / "rm_margins.png", "score(chosen) - score(rejected)",
                       "held-out pairs", f"{cfg.name}: pairwise accuracy {accuracy}")
        artifacts.append("rm_margins.png")
    return StageOutput(outputs={"model": "model"}, metrics=metrics, artifacts=artifacts)
