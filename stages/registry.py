"""Stage kinds by name: each maps to its config model and its module (whose `run` trains)."""

from __future__ import annotations

import hashlib
import importlib
import inspect
from pathlib import Path

from data_curation.stage_kinds import CURATION_CONFIGS
from stages.grpo import GRPOConfig
from stages.sft import SFTConfig

STAGE_CONFIGS = {"sft": SFTConfig, "grpo": GRPOConfig, **CURATION_CONFIGS}
STAGE_MODULES = {"sft": "stages.sft", "grpo": "stages.grpo", **{k: "data_curation.stage_kinds" for k in CURATION_CONFIGS}}

# Code every kind's output depends on besides its own module: the worker runtime, generation,
# evaluation and rewards (eval metrics are part of a stage's result).
KIND_CODE = {"grpo": ["stages/grpo_trainer.py", "stages/rl_losses.py", "stages/prompt_sampler.py",
                      "stages/rl_curves.py"],
             **{k: ["data_curation/decontaminate.py", "data_curation/ngrams.py", "data_curation/dedup.py",
                    "data_curation/trace_filter.py", "data_curation/sampling_filters.py", "data_curation/report.py"]
                for k in CURATION_CONFIGS}}
SHARED_CODE = ["stages/templates.py", "stages/runtime.py", "stages/generation.py", "stages/evaluate.py", "stages/rewards"]


def run_function(kind: str):
    return importlib.import_module(STAGE_MODULES[kind]).run


def code_version(kind: str) -> str:
    """Hash of the source a stage's output depends on; part of the cache key."""
    root = Path(__file__).resolve().parent.parent
    files = [Path(inspect.getfile(STAGE_CONFIGS[kind]))] + [root / rel for rel in KIND_CODE.get(kind, [])]
    for rel in SHARED_CODE:
        p = root / rel
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]
