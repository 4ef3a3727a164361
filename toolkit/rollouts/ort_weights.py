"""A policy's new weights written into its ONNX Runtime GenAI graph in about a second, instead of a
rebuild (~10 s): what makes ONNX Runtime worth using for GRPO's rollouts (stages.ort_rollouts).

A refresh maps the trainer's state dict as the model builder lays it out (toolkit.rollouts.ort_layout),
writes the bytes at their offsets in a private copy of the conversion, and loads the graph again
(measured on SmolLM2: about 0.5 s to write, 0.5 s to load). `WritableConversion` refuses a
conversion unless the starting model's weights, mapped this way, reproduce the builder's output byte
for byte, before any training step.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from toolkit.rollouts.conversions import model_weights, write_tensors
from toolkit.rollouts.ort import converted, open_model
from toolkit.rollouts.ort_layout import builder_tensors, initializer_layout, mapping_problem


def plain_state_dict(policy) -> dict:
    """The policy's weights under the plain model's names. A LoRA policy (PEFT) gives its adapters
    merged in, W + scale * B A per adapted weight, computed into new tensors: the trainer's own
    weights are not touched (merging in place and back, as TRL does for vLLM, leaves float32 drift
    in the frozen base weights every step)."""
    if not hasattr(policy, "get_base_model"):
        return policy.state_dict()
    import torch
    from peft.tuners.lora import LoraLayer

    base = policy.get_base_model()
    weights = {key.replace(".base_layer.", "."): value for key, value in base.state_dict().items()
               if ".lora_" not in key}
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and not module.merged and not module.disable_adapters:
                for adapter in module.active_adapters:
                    weights[f"{name}.weight"] = weights[f"{name}.weight"] + module.get_delta_weight(adapter)
    return weights


class WritableConversion:
    """A private float32 conversion of `model_dir` in `workdir`, whose weights `load` overwrites.

    The layout check compares `model_dir`'s own weights (or `starting`, for a test), mapped, with the
    builder's output; a trainer resumed from a checkpoint then writes its weights at the first load."""

    def __init__(self, model_dir: str, workdir: Path, threads: int, starting: dict | None = None):
        shared = converted(model_dir, "float32")
        self.dir = Path(workdir) / "ort-policy"
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.copytree(shared, self.dir)
        self.layout = initializer_layout(self.dir)
        self.threads = threads
        weights, self.num_layers = model_weights(model_dir)
        if problem := mapping_problem(self.dir, self.layout, starting if starting is not None else weights,
                                      self.num_layers):
            raise ValueError(f"{model_dir}: {problem}: use rollout: hf")

    def load(self, state_dict: dict | None = None):
        """The graph with `state_dict`'s weights written in (None: as it is), loaded afresh. The
        caller drops its previous model first: the file is rewritten under it."""
        if state_dict is not None:
            write_tensors(self.dir, self.layout, builder_tensors(state_dict, self.num_layers))
        return open_model(self.dir, self.threads)
