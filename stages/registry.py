"""Every stage kind, one record each: its config model (the recipe schema, whose `kind` field names
it, and whose OUTPUTS say what it produces) and the function that runs it. Adding a kind is one new
module and one line in KINDS.

A stage's code version (part of its cache key) is derived, not listed: the hash of the kind's
module, the worker-side runtime and evaluation, and every project module those import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stages import curation, distill, dpo, fusion, grpo, merge, preference_pairs, rejection_sample, reward_model, sft
from stages.common import StageBase
from toolkit.core.fingerprints import code_fingerprint

# Modules every kind's result depends on besides its own: how the worker loads data and evaluates.
SHARED_MODULES = ("stages.runtime", "stages.evaluate")


@dataclass(frozen=True)
class StageKind:
    config: type[StageBase]
    run: Callable  # run(cfg, ctx: StageContext) -> StageOutput

    @property
    def name(self) -> str:
        return self.config.model_fields["kind"].default

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.config.OUTPUTS

    def code_version(self) -> str:
        return code_fingerprint((self.run.__module__, *SHARED_MODULES))


KINDS = [
    StageKind(sft.SFTConfig, sft.run),
    StageKind(grpo.GRPOConfig, grpo.run),
    *(StageKind(config, curation.run) for config in curation.CURATION_CONFIGS.values()),
    StageKind(rejection_sample.RejectionSampleConfig, rejection_sample.run),
    StageKind(fusion.ThinkingFusionConfig, fusion.run),
    StageKind(preference_pairs.PreferencePairsConfig, preference_pairs.run),
    StageKind(reward_model.RewardModelConfig, reward_model.run),
    StageKind(dpo.DPOConfig, dpo.run),
    StageKind(merge.MergeConfig, merge.run),
    StageKind(distill.DistillConfig, distill.run),
]
STAGE_KINDS: dict[str, StageKind] = {k.name: k for k in KINDS}
STAGE_CONFIGS = {name: k.config for name, k in STAGE_KINDS.items()}
