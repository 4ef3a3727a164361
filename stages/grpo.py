"""Stage kind `grpo`: reasoning RL with verifiable rewards on TRL's GRPOTrainer.

`loss` picks the algorithm (formulas in the project's recipe facts sheet, code in stages/rl_losses.py):
- grpo: DeepSeekMath. Std-normalised group advantages, per-sequence token averaging, k3 KL (beta 0.04).
- dr_grpo: no std division, a constant length normaliser, no KL.
- dapo: token-level loss, clip-higher (0.2 / 0.28), no KL, dynamic sampling, truncated completions
  masked out (or, with the `overlong_dapo` reward in `rewards`, the soft punishment instead).
- kimi_mirror_descent: Kimi k1.5. Mean-baselined sequence log-likelihood gradient with a
  (tau/2) squared log-ratio regulariser against the sampling policy, no clipping.
Unset knobs (`beta`, `clip_high`, `dynamic_sampling`, `mask_truncated`) take the variant's paper value.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from stages.common import DataOrMix, RewardSpec, StageBase, TrainingKnobs
from stages.contracts import StageOutput
from stages.prompt_sampler import PromptSampler, SamplerKind
from stages.rl_curves import curve_metrics, plot_curves
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
from toolkit.core.templates import check_template, render_prompt
from toolkit.rewards import check_reward_specs, distinct_names, get_reward, reward_counter_metrics, reward_tags
from toolkit.rewards.earnable import unearnable
from toolkit.rewards.verifiers import VERIFIER_REWARDS
from toolkit.rollouts import load_tokenizer, vllm_unavailable
from toolkit.rollouts.ort import ort_unavailable

LossVariant = Literal["grpo", "dr_grpo", "dapo", "kimi_mirror_descent"]
PAPER_DEFAULTS = {  # beta, clip_high (None = clip_low), dynamic sampling, mask truncated, std scaling
    "grpo": (0.04, None, False, False, True),
    "dr_grpo": (0.0, None, False, False, False),
    "dapo": (0.0, 0.28, True, True, True),
    "kimi_mirror_descent": (0.0, None, False, False, False),
}


class GRPOConfig(DataOrMix, StageBase, TrainingKnobs):
    kind: Literal["grpo"] = "grpo"
    model: str = Field(description="policy to start from: alias, named model, path, hub id or `stage.model`")
    rewards: list[RewardSpec] = Field(min_length=1, description="summed with their weights into the reward")
    loss: LossVariant = "grpo"
    beta: float | None = Field(None, ge=0, description="KL weight to the reference; None = the variant's value")
    clip_low: float = Field(0.2, gt=0, lt=1)
    clip_high: float | None = Field(None, gt=0, description="None = clip_low (0.28 for dapo)")
    tau: float = Field(0.1, gt=0, description="kimi_mirror_descent regulariser; not stated in the paper")
    num_generations: int = Field(8, ge=2, description="group size G: completions per prompt")
    num_iterations: int | None = Field(None, ge=1, description="updates per rollout batch (mu); None = the "
                                       "variant's: 2 for kimi_mirror_descent (its tau term needs pi != pi_old), else 1")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_completion_length: int = Field(256, ge=1)
    ref_reset_steps: int | None = Field(None, ge=1, description="copy the policy into the reference every N "
                                        "steps (R1: 400); needs beta > 0")
    dynamic_sampling: bool | None = None
    dynamic_sampling_max_rounds: int = Field(4, ge=1, description="rollout rounds per step at most")
    dynamic_sampling_by: Literal["reward", "accuracy"] | None = Field(
        None, description="drop groups whose total reward is constant, or (DAPO) whose success reward is all 0 or "
        "all 1; None = the variant's: accuracy for dapo, as the paper filters, reward otherwise")
    mask_truncated: bool | None = Field(None, description="drop truncated completions from the loss")
    log_completions: bool = Field(False, description="keep every step's rollouts (prompt, completion, each reward, "
                                  "the advantage) as completions/completions_<step>.parquet in the stage's output")
    sampler: SamplerKind = "random"
    difficulty_key: Literal["difficulty", "pass_rate"] = Field(
        "difficulty", description="curriculum order: the difficulty label, or a measured pass rate (high = easy)")
    success_reward: str | None = Field(None, description="reward whose value is a prompt's success (prioritized "
                                       "sampling, accuracy metric); None = the first reward")
    template: str = Field("chat", description="prompt template (toolkit.core.templates)")
    rollout: Literal["hf", "ort", "vllm_colocate", "vllm_server"] = Field(
        "hf", description="who samples the rollouts: TRL's HF generate; ONNX Runtime GenAI on CPU with the policy's "
        "weights written into its graph every step (stages.ort_rollouts); TRL's vLLM modes on GPU")
    learning_rate: float = Field(1e-6, gt=0)
    lr_scheduler: str = "constant"
    per_device_batch_size: int = Field(8, ge=1, description="completions per device per micro-step")
    adam_epsilon: float = Field(1e-8, gt=0, description="AdamW's epsilon (HF's default 1e-8)")
    length_bucket_rows: int | None = Field(
        None, ge=1, description="compute the policy's and the reference's log-probabilities this many completions at "
        "a time, sorted by length and cut to their own longest: the same numbers for the real tokens' work (with a "
        "dense LM head on a float32 CPU model, a demo step's training half 2.4x shorter); None = TRL's one padded batch")

    OUTPUTS: ClassVar[tuple[str, ...]] = ("model",)
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = ("model",)
    EVAL_INPUT: ClassVar[str | None] = "model"
    DATA_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    def model_inputs(self) -> dict[str, str]:
        return {**super().model_inputs(), **reward_model_inputs(self.rewards)}

    @model_validator(mode="after")
    def _consistent(self):
        if (self.per_device_batch_size * self.gradient_accumulation_steps) % self.num_generations:
            raise ValueError(f"per_device_batch_size x gradient_accumulation_steps "
                             f"({self.per_device_batch_size} x {self.gradient_accumulation_steps}) must be a multiple "
                             f"of num_generations ({self.num_generations}): each rank rolls out whole groups")
        if self.ref_reset_steps and not self.effective("beta"):
            raise ValueError("ref_reset_steps needs beta > 0: without a KL term there is no reference to reset")
        if self.ref_reset_steps and self.lora is not None:
            raise ValueError("ref_reset_steps is not supported with LoRA (TRL cannot sync a PEFT reference)")
        if self.loss == "kimi_mirror_descent" and self.num_iterations == 1:
            raise ValueError("kimi_mirror_descent with num_iterations 1 is REINFORCE with a mean baseline: the "
                             "policy IS the rollout policy at every update, so the tau term has no gradient. Kimi "
                             "(2.3.2) updates several times per rollout batch: use num_iterations >= 2")
        return self

    def effective(self, knob: str):
        """The value a knob takes: the recipe's, or the loss variant's paper value when unset."""
        beta, clip_high, dynamic, mask, scale = PAPER_DEFAULTS[self.loss]
        if mask and any(r.name == "overlong_dapo" for r in self.rewards):
            mask = False  # DAPO uses one or the other: the soft punishment needs the truncated samples
        defaults = {"beta": beta, "clip_high": clip_high or self.clip_low, "dynamic_sampling": dynamic,
                    "mask_truncated": mask, "scale_rewards": scale,
                    "dynamic_sampling_by": "accuracy" if self.loss == "dapo" else "reward",
                    "num_iterations": 2 if self.loss == "kimi_mirror_descent" else 1}
        value = getattr(self, knob, None)
        return defaults[knob] if value is None else value

    def semantic_errors(self) -> list[tuple[tuple, str]]:
        errors = [(("rewards",) + rel, msg) for rel, msg in check_reward_specs(self.rewards, self.max_completion_length)]
        for j, r in enumerate(self.rewards):
            if r.start_step >= self.max_steps:
                errors.append((("rewards", j, "start_step"), f"reward {r.name} starts at step {r.start_step}, and the "
                               f"stage ends after max_steps = {self.max_steps}: it would never count"))
        names = [r.name for r in self.rewards]
        if self.success_reward and self.success_reward not in names:
            errors.append((("success_reward",), f"{self.success_reward!r} is not one of this stage's rewards {names}"))
        if msg := check_template(self.template):
            errors.append((("template",), msg))
        elif not errors:
            errors += [(("rewards",) + rel, msg) for rel, msg in
                       unearnable(self.rewards, self.template, self.max_completion_length)]
        if self.rollout == "vllm_server" and self.launcher.rollout_server is None:
            errors.append((("launcher", "rollout_server"), "rollout: vllm_server needs launcher.rollout_server "
                           "(its GPUs and port; the launcher starts `trl vllm-serve` there)"))
        if self.rollout == "ort":
            errors += [(("rollout",), msg) for msg in [ort_unavailable()] if msg]
            if self.launcher.mode == "deepspeed" and "zero3" in self.launcher.deepspeed_config:
                errors.append((("rollout",), "rollout: ort writes the whole policy into its graph every step: not "
                               "with ZeRO-3's sharded weights; use rollout: hf"))
        elif self.rollout != "hf":
            errors += [(("rollout",), msg) for msg in vllm_unavailable()]
            if self.loss == "kimi_mirror_descent":
                errors.append((("loss",), "kimi_mirror_descent does not apply TRL's vLLM importance-sampling "
                               "correction; use rollout: hf, or a clipped loss (grpo, dr_grpo, dapo) with vLLM"))
        return errors


def reward_model_inputs(rewards: list[RewardSpec]) -> dict[str, str]:
    """Models named in reward params (`reward_model`'s `model: rm.model`), by field path."""
    return {f"rewards.{j}.params.model": r.params["model"] for j, r in enumerate(rewards)
            if isinstance(r.params.get("model"), str)}


def with_resolved_models(spec: RewardSpec, j: int, ctx) -> RewardSpec:
    """The spec with its `model` param replaced by the directory the flow resolved it to."""
    path = f"rewards.{j}.params.model"
    if path not in ctx.spec.inputs:
        return spec
    return spec.model_copy(update={"params": {**spec.params, "model": ctx.input(path)}})


class StageReward:
    """A registry reward as one RL stage applies it (picklable):
    - held at 0 before `start_step` (TRL passes the trainer state; Kimi's delayed length reward);
    - in a mixture of prompts, a verifier's reward (accuracy_math, code_exec, ifeval_constraints)
      judges only rows of its own verifier and gives None elsewhere, so a math checker never reads an
      instruction row's constraints as a gold answer; `only` names the verifiers explicitly (R1
      stage 4: rules for reasoning prompts, reward models for the rest)."""

    def __init__(self, reward, start_step: int = 0, only: list[str] | None = None):
        self.reward, self.start_step = reward, start_step
        default = [v for v, name in VERIFIER_REWARDS.items() if name == reward.name]
        self.own = set(only or default) or None
        self.__name__, self.counters, self.tags = reward.__name__, reward.counters, reward.tags

    def __call__(self, *args, trainer_state=None, verifier=None, **kwargs):
        n = len(kwargs["completions"])
        if trainer_state is not None and trainer_state.global_step < self.start_step:
            return [0.0] * n
        if self.own is None or verifier is None:
            return self.reward(*args, **kwargs)
        mine = [i for i in range(n) if verifier[i] in self.own]
        values: list[float | None] = [None] * n
        if mine:
            picked = {k: ([v[i] for i in mine] if isinstance(v, list) and len(v) == n else v) for k, v in kwargs.items()}
            for i, value in zip(mine, self.reward(*args, **picked)):
                values[i] = value
        return values


def stage_reward(spec: RewardSpec, stage_max_length: int | None = None) -> StageReward:
    return StageReward(get_reward(spec.name, stage_max_length, **spec.params), spec.start_step, spec.only)


def trl_config(cfg: GRPOConfig, ctx):
    from trl import GRPOConfig as TRLGRPOConfig

    vllm = {} if cfg.rollout in ("hf", "ort") else {"use_vllm": True, "vllm_mode": cfg.rollout.removeprefix("vllm_")}
    if server := cfg.launcher.rollout_server:  # started by the launcher (pipeline.launch.rollout_server)
        vllm.update(vllm_server_host=server.host, vllm_server_port=server.port,
                    vllm_server_timeout=float(server.startup_timeout_s))
    beta = cfg.effective("beta")
    return TRLGRPOConfig(
        **trainer_args(cfg, ctx), **vllm,
        # kimi_mirror_descent replaces TRL's loss (stages.grpo_trainer); "grpo" only keeps TRL's checks happy
        loss_type=cfg.loss if cfg.loss != "kimi_mirror_descent" else "grpo",
        scale_rewards="group" if cfg.effective("scale_rewards") else "none",
        # DeepSeekMath's plain k3 (TRL would also weight it by pi/pi_old, which differs once mu > 1)
        beta=beta, use_bias_correction_kl=False, epsilon=cfg.clip_low, epsilon_high=cfg.effective("clip_high"),
        mask_truncated_completions=cfg.effective("mask_truncated"),
        num_generations=cfg.num_generations, num_iterations=cfg.effective("num_iterations"),
        temperature=cfg.temperature, top_p=cfg.top_p, max_completion_length=cfg.max_completion_length,
        reward_weights=[r.weight for r in cfg.rewards],
        sync_ref_model=bool(cfg.ref_reset_steps), ref_model_mixup_alpha=1.0,  # alpha 1 = a hard reset
        ref_model_sync_steps=cfg.ref_reset_steps or 512,
        model_init_kwargs={"trust_remote_code": cfg.trust_remote_code},
        log_completions=cfg.log_completions, num_completions_to_print=0,  # parquet only, no console table
        adam_epsilon=cfg.adam_epsilon,
    )


def run(cfg: GRPOConfig, ctx) -> StageOutput:
    import json
    from pathlib import Path

    from datasets import Dataset

    from stages.grpo_trainer import SAMPLER_STATE, PosttrainGRPOTrainer, RLOptions
    from stages.ort_rollouts import OrtRollouts
    from toolkit.rollouts import thread_budget

    model_dir = ctx.input("model")
    tokenizer = load_tokenizer(model_dir, cfg.trust_remote_code)
    rows, composition = training_rows(cfg, ctx, "RL prompt")
    dataset = Dataset.from_list([{"prompt": render_prompt(cfg.template, r), "answer": r["answer"],
                                  "language": r["language"],
                                  "verifier": r["verifier"], "_index": i} for i, r in enumerate(rows)])
    sampler = PromptSampler(cfg.sampler, len(rows), seed=cfg.seed, difficulty=difficulty_order(cfg, rows))
    names = [r.name for r in cfg.rewards]
    rl = RLOptions(sampler=sampler, success_reward=names.index(cfg.success_reward or names[0]), loss=cfg.loss,
                   tau=cfg.tau, dynamic_sampling=cfg.effective("dynamic_sampling"),
                   max_rounds=cfg.dynamic_sampling_max_rounds, dynamic_sampling_by=cfg.effective("dynamic_sampling_by"),
                   length_bucket_rows=cfg.length_bucket_rows)
    rewards = distinct_names([stage_reward(with_resolved_models(r, j, ctx), cfg.max_completion_length)
                              for j, r in enumerate(cfg.rewards)])
    rollout_func = None if cfg.rollout != "ort" else OrtRollouts(
        model_dir, tokenizer, cfg.temperature, cfg.top_p, cfg.max_completion_length, cfg.seed, thread_budget(),
        workdir=ctx.output_dir / f".ort-policy-rank{ctx.rank}")
    trainer = PosttrainGRPOTrainer(model=model_dir, args=trl_config(cfg, ctx), train_dataset=dataset,
                                   reward_funcs=rewards, processing_class=tokenizer, rollout_func=rollout_func,
                                   peft_config=lora_config(cfg), callbacks=[progress_callback(ctx), *ctx.callbacks], rl=rl)
    args = trainer.args  # the prompts the stage draws: one batch of per_device x accumulation per num_iterations steps
    sampler.pace(args.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps
                 * args.world_size // (args.num_generations * args.num_iterations))
    resume = last_checkpoint(ctx)
    if resume and (Path(resume) / SAMPLER_STATE).exists():
        sampler.load_state_dict(json.loads((Path(resume) / SAMPLER_STATE).read_text()))
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        if rollout_func:
            rollout_func.close()
    save_model(trainer, tokenizer, ctx)
    metrics = {**train_metrics(trainer, resume), "train/prompts": float(len(rows)),
               "train/prompts_drawn": float(sampler.drawn), "train/prompts_planned": float(sampler.stage_prompts),
               **curve_metrics(trainer.state.log_history), **reward_counter_metrics(rewards, "train/")}
    mix_metrics, artifacts = record_mixture(composition, ctx)
    metrics.update(mix_metrics)
    if ctx.is_main and plot_curves(trainer.state.log_history, ctx.output_dir / "rl_curves.png"):
        artifacts.append("rl_curves.png")
    if ctx.is_main and cfg.log_completions:  # TRL writes them beside the checkpoints, which publishing drops
        kept = ctx.output_dir / "completions"
        kept.mkdir(exist_ok=True)  # may hold an interrupted try's steps already
        for step in (ctx.checkpoint_dir / "completions").glob("*.parquet"):
            step.replace(kept / step.name)
        artifacts.append("completions")
    return StageOutput(outputs={"model": "model"}, metrics=metrics, artifacts=artifacts, tags=reward_tags(rewards))


def difficulty_order(cfg: GRPOConfig, rows: list[dict]) -> list[float] | None:
    """Curriculum sort keys, low = easy: the difficulty label, or 1 - pass rate when measured."""
    if cfg.sampler != "curriculum":
        return None
    key = cfg.difficulty_key
    missing = [r["id"] for r in rows if r.get(key) is None]
    if missing:
        raise ValueError(f"curriculum by {key!r} needs it on every row; {len(missing)} rows lack it, e.g. {missing[:3]}")
    return [float(r[key]) if key == "difficulty" else 1.0 - float(r[key]) for r in rows]
