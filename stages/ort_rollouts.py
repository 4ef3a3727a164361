"""GRPO's rollouts sampled by ONNX Runtime GenAI (`rollout: ort`), plugged into TRL's `rollout_func`.

TRL generates inside the trainer with HF `generate`; on this CPU ONNX Runtime GenAI samples the same
model at float32 2.5-3x faster with HF's greedy outputs (benchmarks/RESULTS.md, fast generation).
What made it a loss before was giving it the policy's new weights: a rebuild costs ~10 s a step.
Here the weights are written into a private copy of the built graph instead
(toolkit.rollouts.ort_weights) when the trainer's step has moved since the last rollout, then the
graph is loaded again: about a second. Every refresh's seconds are logged (`rollout/refresh_s`).

Same as TRL's own path: the prompts TRL hands over (each already repeated `num_generations` times)
are rendered by TRL's `_tokenize_prompts`, one completion comes back per prompt, cut after its end
token (kept, so TRL sees which completions ended), sampled at the stage's temperature and top_p from
float32 weights. Different: no per-token sampling logprobs are returned (TRL uses them only for
vLLM's importance-sampling correction, which this path does not turn on), and the random stream is
ONNX Runtime's, seeded per rank and per call from the stage's seed.

Needs the whole policy on each rank: not with ZeRO-3 (GRPOConfig refuses it). A LoRA policy's
adapters are merged into the weights written (`plain_state_dict`), so the graph samples the policy
being trained.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from toolkit.rollouts.ort import ort_sampler
from toolkit.rollouts.ort_weights import WritableConversion, plain_state_dict
from toolkit.rollouts.sampling import SamplingSpec


class OrtRollouts:
    """A `rollout_func(prompts, trainer)` for TRL's GRPOTrainer; `close()` removes its copy of the graph
    (in `workdir`, emptied first, or a temp folder). `model` is the graph loaded with the weights of
    trainer step `step`."""

    def __init__(self, model_dir: str, tokenizer, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int, threads: int, workdir: Path | None = None):
        self.model_dir, self.tokenizer, self.threads = model_dir, tokenizer, threads
        self.temperature, self.top_p, self.max_new_tokens, self.seed = temperature, top_p, max_new_tokens, seed
        # the stage passes a folder of its own output: a worker killed before close() leaves its copy
        # of the graph (520 MB for SmolLM2) there, where the stage's next attempt clears it, not in /tmp
        if workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="posttrain-ort-policy-"))
        else:
            shutil.rmtree(workdir, ignore_errors=True)
            workdir.mkdir(parents=True)
            self.workdir = workdir
        self.conversion: WritableConversion | None = None
        self.model = self.sample = self.step = None
        self.calls = 0

    def refresh(self, trainer) -> None:
        started = time.perf_counter()  # the LoRA merge counts as refresh time too
        weights = plain_state_dict(trainer.accelerator.unwrap_model(trainer.model))
        self.model = self.sample = None  # drop the old graph before its file is rewritten
        if self.conversion is None:  # built from model_dir; its layout checked against model_dir's weights
            self.conversion = WritableConversion(self.model_dir, self.workdir, self.threads)
        self.model = self.conversion.load(weights)  # written every time: a resumed trainer's start is not model_dir
        self.sample = ort_sampler(self.model, self.tokenizer or trainer.processing_class)
        self.step = trainer.state.global_step
        trainer._metrics["train"]["rollout/refresh_s"].append(time.perf_counter() - started)

    def __call__(self, prompts: list, trainer) -> dict:
        if self.step != trainer.state.global_step:
            self.refresh(trainer)
        prompt_ids = trainer._tokenize_prompts(prompts)[0]
        # a distinct stream per rank and call; the sampler adds one per generator of 32 rows within a call
        seed = self.seed * 1_000_003 + trainer.accelerator.process_index * 100_003 + self.calls * 1_009
        self.calls += 1
        spec = SamplingSpec(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                            seed=seed)
        completion_ids = self.sample([list(p) for p in prompt_ids], self.max_new_tokens, False, spec)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    def close(self) -> None:
        self.model = self.sample = None
        shutil.rmtree(self.workdir, ignore_errors=True)
