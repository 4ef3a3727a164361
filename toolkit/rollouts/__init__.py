"""Rollouts: one interface for every stage that samples from a model (evaluation with its modes
and budgets, curation filters, rejection sampling, preference sampling, teacher traces,
`posttrain generate` and `posttrain eval`).

`open_engine(model_dir, engine, precision)` loads a model into an engine (`engines.py`: hf, ct2,
ort, vllm, auto) and `Engine.complete(prompts, spec)` samples `spec.n` Completions per prompt. HF,
CTranslate2 and ONNX Runtime GenAI share one implementation of prompts, thinking modes and budgets
(`sampling.py`) over a token-level sampler each (`hf.py`, `ct2.py`, `ort.py`); vLLM samples from
text (`vllm.py`). Completions are
decoded with special tokens kept (so <think> tags survive in tokenizers where they are special) and
then cut at the end-of-turn token.

GRPO's rollouts are TRL's own (HF generate in the trainer, TRL's vLLM modes on GPU) or ONNX Runtime
GenAI's through TRL's `rollout_func` with the policy's weights written into the graph each step
(`ort_weights.py`, used by stages/ort_rollouts.py).
"""

from toolkit.rollouts.engines import (
    ENGINES,
    PRECISIONS,
    Engine,
    engine_problems,
    open_engine,
    resolve_engine,
    rollout,
    rollout_completions,
    thread_budget,
)
from toolkit.rollouts.hf import load_for_generation, load_tokenizer
from toolkit.rollouts.sampling import Completion, SamplingSpec, render
from toolkit.rollouts.vllm import vllm_unavailable

__all__ = ["ENGINES", "PRECISIONS", "Completion", "Engine", "SamplingSpec", "engine_problems", "load_for_generation",
           "load_tokenizer", "open_engine", "render", "resolve_engine", "rollout", "rollout_completions",
           "thread_budget", "vllm_unavailable"]
