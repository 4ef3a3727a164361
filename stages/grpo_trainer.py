"""TRL's GRPOTrainer with what the recipes need and TRL lacks, each a small override:

- prompts come from a `PromptSampler` (random / curriculum / prioritized) at the moment a rollout
  batch is needed, and rollout outcomes feed its success table; its state goes into checkpoints;
- DAPO's dynamic sampling: groups whose rewards (or, as DAPO does, whose accuracies) are all equal
  are dropped and the batch is refilled with fresh groups (at most `max_rounds` rollout rounds; then
  zero-variance groups fill the rest, masked out of the loss and out of every denominator, so they
  dilute nothing: `filler_rescale`);
- Kimi k1.5's mirror-descent loss (`stages.rl_losses.kimi_mirror_descent_loss`);
- log-probabilities (the policy's and the reference's) computed over buckets of rows of like length,
  each trimmed of the padding no row in it needs, with a prompt its group shares run once
  (`stages.logp_buckets`): the same numbers as TRL's one padded batch, for the work of the real
  tokens (`length_bucket_rows`; None keeps TRL's); in float32 on a CPU, scored by a dense LM head
  (`stages.dense_logps`) in place of TRL's fused one, whose CPU fallback is slow;
- HF rollouts (`rollout: hf`) decode on a CPU with the weight as the matmul's left operand
  (`toolkit.rollouts.cpu_decode`): the same float32 products without MKL's packing of every weight at
  every decode step;
- rollout and training throughput and an accuracy metric in every logged step.

Everything else (generation, reference model, KL, clipping, the other losses, logging) is TRL's.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from stages.dense_logps import add_dense_lm_head, dense_head_usable
from stages.logp_buckets import bucketed_logps, shared_prompt_forward
from stages.prompt_sampler import PromptSampler
from stages.rl_losses import filler_rescale, kimi_mirror_descent_loss, zero_variance_groups
from toolkit.rollouts.cpu_decode import weight_major_linear

SAMPLER_STATE = "sampler_state.json"


@dataclass
class RLOptions:
    sampler: PromptSampler
    success_reward: int  # index of the reward whose value is a prompt's success in [0, 1]
    loss: str = "grpo"
    tau: float = 0.1
    dynamic_sampling: bool = False
    max_rounds: int = 4
    dynamic_sampling_by: str = "reward"  # "reward": total reward constant; "accuracy": success all 0 or all 1
    length_bucket_rows: int | None = None  # rows per log-probability forward, sorted by length; None = TRL's


def concat_groups(parts: list[dict], pad_id: int) -> dict:
    """Stack rollout batches of different widths: prompts stay left-padded, completions right-padded."""
    def stack(key: str, left: bool, value=0):
        width = max(p[key].shape[1] for p in parts)
        padded = []
        for p in parts:
            t = p[key]
            pad = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype, device=t.device)
            padded.append(torch.cat([pad, t] if left else [t, pad], dim=1))
        return torch.cat(padded)

    out = {"prompt_ids": stack("prompt_ids", True, pad_id), "prompt_mask": stack("prompt_mask", True),
           "completion_ids": stack("completion_ids", False, pad_id),
           "completion_mask": stack("completion_mask", False),
           "advantages": torch.cat([p["advantages"] for p in parts])}
    for key in ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps"):
        if key in parts[0]:
            out[key] = stack(key, False)
    if "importance_sampling_ratio" in parts[0]:  # vLLM's correction: (B, T) per token, or (B, 1) per sequence
        per_sequence = parts[0]["importance_sampling_ratio"].shape[1] == 1
        out["importance_sampling_ratio"] = (torch.cat([p["importance_sampling_ratio"] for p in parts]) if per_sequence
                                            else stack("importance_sampling_ratio", False, 1.0))
    unsupported = set(parts[0]) - set(out) - {"num_items_in_batch"}
    if unsupported:
        raise NotImplementedError(f"dynamic sampling cannot merge rollout fields {sorted(unsupported)}")
    return out


def select_rows(batch: dict, rows: torch.Tensor) -> dict:
    return {k: v[rows] for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() > 0}


class PosttrainGRPOTrainer(GRPOTrainer):
    def __init__(self, *args, rl: RLOptions, **kwargs):
        super().__init__(*args, **kwargs)
        self.rl = rl
        self._rollout_s = 0.0
        self._step_tokens = 0.0
        self._local_success: torch.Tensor | None = None  # this rank's success column of the last rollout
        self._bucket_head = "fused_lm_head"  # the LM head the buckets score with
        if rl.length_bucket_rows and not (self.args.bf16 or self.args.fp16):
            heads = [m for m in (getattr(self.model, "get_base_model", lambda: self.model)(), self.ref_model) if m is not None]
            if all(dense_head_usable(m) for m in heads):  # float32 on a CPU: TRL's head folds its tiles slowly there
                for m in heads:
                    add_dense_lm_head(m, self.temperature)
                self._bucket_head = "dense_lm_head"

    # ---- prompts: drawn from the sampler when a rollout batch is needed --------------------------
    def _draw_rows(self, n_local: int) -> list[dict]:
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        indices = self.rl.sampler.next_batch(n_local * world)[rank * n_local:(rank + 1) * n_local]
        return [self.train_dataset[i] for i in indices for _ in range(self.num_generations)]

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:  # evaluation batches come from the eval dataloader as they are
            return super()._generate_and_score_completions(inputs)
        started = time.perf_counter()
        n_local = len(inputs) // self.num_generations
        batch = super()._generate_and_score_completions(self._draw_rows(n_local))
        if self.rl.dynamic_sampling:
            batch = self._refill_informative(batch, n_local)
        elapsed = time.perf_counter() - started
        self._rollout_s += elapsed
        tokens = self.accelerator.gather(batch["completion_mask"].sum().float().view(1)).sum().item()
        self._metrics["train"]["rollout/tokens_per_s"].append(tokens / max(elapsed, 1e-9))
        self._metrics["train"]["rollout/seconds"].append(elapsed)
        return batch

    def _generate_single_turn(self, *args, **kwargs):  # TRL's HF `generate` (vLLM and rollout_func: no torch linears)
        with weight_major_linear():
            return super()._generate_single_turn(*args, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # gathered
        if self.model.training:
            success = rewards[:, self.rl.success_reward]
            rank = self.accelerator.process_index
            self._local_success = success[rank * len(prompts):(rank + 1) * len(prompts)]
            self.rl.sampler.update(gather_object([x["_index"] for x in inputs]), success.tolist())
            self._metrics["train"]["accuracy"].append(torch.nanmean(success).item())
        return rewards

    # ---- DAPO dynamic sampling ----------------------------------------------------------------
    def _informative(self, batch: dict) -> torch.Tensor:
        """One bool per local group: does it carry a gradient (by reward), or (by accuracy, as
        DAPO) are its successes neither all 0 nor all 1."""
        G = self.num_generations
        by_reward = ~zero_variance_groups(batch["advantages"], G)
        if self.rl.dynamic_sampling_by != "accuracy" or self._local_success is None:
            return by_reward
        # success clamped to [0, 1], as the sampler reads it: 1 = solved
        success = torch.nan_to_num(self._local_success.to(by_reward.device), nan=0.0).clamp(0, 1).view(-1, G)
        mixed = (success.max(dim=1).values > success.min(dim=1).values)
        return mixed & by_reward

    def _refill_informative(self, batch: dict, n_local: int) -> dict:
        """Keep informative groups; roll out fresh groups until every rank has `n_local` of them or
        `max_rounds` is reached (all ranks run the same number of rounds, as rollouts are collective).
        Zero-variance groups fill whatever is left with their completion mask zeroed, so they count
        neither in the loss nor in DAPO's token-level divisor."""
        G = self.num_generations
        parts, informative = [batch], [self._informative(batch)]
        rounds = 1
        while True:
            have = torch.stack([m.sum() for m in informative]).sum().view(1)
            enough = self.accelerator.gather(have).min().item() >= n_local
            if enough or rounds >= self.rl.max_rounds:
                break
            more = super()._generate_and_score_completions(self._draw_rows(n_local))
            parts.append(more)
            informative.append(self._informative(more))
            rounds += 1
        merged = concat_groups(parts, self.processing_class.pad_token_id)
        flags = torch.cat(informative)
        order = torch.cat([flags.nonzero().view(-1), (~flags).nonzero().view(-1)])[:n_local]
        rows = (order.view(-1, 1) * G + torch.arange(G, device=order.device)).view(-1)
        out = select_rows(merged, rows)
        filler = (~flags[order]).repeat_interleave(G)
        out["completion_mask"] = out["completion_mask"] * (~filler).unsqueeze(1).to(out["completion_mask"].dtype)
        local_tokens = out["completion_mask"].sum().float().view(1)
        out["num_items_in_batch"] = self.accelerator.gather(local_tokens).sum()
        self._metrics["train"]["dynamic_sampling/rounds"].append(float(rounds))
        self._metrics["train"]["dynamic_sampling/cap_hit"].append(float(not enough))
        self._metrics["train"]["dynamic_sampling/informative_frac"].append(flags[order].float().mean().item())
        return out

    # ---- log-probabilities over length buckets ---------------------------------------------------
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        """TRL's, over length buckets (`stages.logp_buckets`), each distinct prompt run once where
        rows share it. Gradient checkpointing recomputes each layer without its cache, so with it
        every row runs its own prompt. MoE aux losses and multimodal inputs keep TRL's path."""
        rows = min(self.rl.length_bucket_rows or 0, batch_size or input_ids.size(0))  # never above TRL's chunk
        if not rows or compute_aux_loss or any(v is not None for v in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **multimodal)
        prompt_width = input_ids.size(1) - logits_to_keep

        def rows_alone(idx, lo, hi):
            logps, entropies, _ = super(PosttrainGRPOTrainer, self)._get_per_token_logps_and_entropies(
                model, input_ids[idx, lo:hi], attention_mask[idx, lo:hi], hi - prompt_width,
                compute_entropy=compute_entropy)
            return logps, entropies

        shared = None if self.args.gradient_checkpointing else shared_prompt_forward(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy, self.accelerator.autocast,
            self._bucket_head)
        logps, entropies = bucketed_logps(shared or rows_alone, attention_mask, logits_to_keep, rows)
        return logps, entropies, None

    # ---- loss and throughput ---------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        self._step_tokens = (inputs["prompt_mask"].sum() + inputs["completion_mask"].sum()).item()
        if self.rl.loss != "kimi_mirror_descent":
            loss = super()._compute_loss(model, inputs)
            # TRL's grpo and dr_grpo count masked filler rows in their per-sequence denominators;
            # dapo divides by tokens (num_items_in_batch), which fillers do not add to
            return loss * filler_rescale(inputs["completion_mask"]) if self.rl.loss in ("grpo", "dr_grpo") else loss
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        mask = inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], mask], dim=1)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        loss = kimi_mirror_descent_loss(logps, old, inputs["advantages"], mask, self.rl.tau, self.beta,
                                        inputs.get("ref_per_token_logps"))
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["entropy"].append(((entropies * mask).sum() / mask.sum().clamp(min=1)).item())
        self._metrics[mode]["mirror_descent/log_ratio_sq"].append(
            (((logps.detach() - old) * mask).sum(1) ** 2).mean().item())
        return loss / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)

    def training_step(self, *args, **kwargs):
        started, rollout_before = time.perf_counter(), self._rollout_s
        loss = super().training_step(*args, **kwargs)
        train_s = time.perf_counter() - started - (self._rollout_s - rollout_before)
        if train_s > 0:
            self._metrics["train"]["train/tokens_per_s"].append(self._step_tokens / train_s)
        return loss

    # ---- sampler state in checkpoints ----------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        # Written before HF's files: HF writes trainer_state.json last, and a checkpoint without it
        # counts as incomplete, so a crash can never leave a "complete" checkpoint without this file.
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial), f"checkpoint-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, SAMPLER_STATE), "w") as f:
                json.dump(self.rl.sampler.state_dict(), f)
        super()._save_checkpoint(model, trial)
