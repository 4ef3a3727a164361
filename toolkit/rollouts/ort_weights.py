"""A policy's new weights written into its ONNX Runtime GenAI graph in about a second, instead of a
rebuild (~10 s): what makes ONNX Runtime worth using for GRPO's rollouts (stages.ort_rollouts).

The model builder stores every weight as an initializer in the graph's external data file
(`model.onnx.data`), at an offset and length the graph names. For the Llama family (SmolLM2, Llama,
Qwen3) it writes each HF weight in a fixed way: MatMul weights transposed, q, k and v concatenated
into one `qkv_proj`, norms as they are (Qwen3's per-head q/k norms too), the tied embedding as
`lm_head`'s transposed weight. So a refresh is: map the trainer's state dict the same way, write the
bytes at their offsets in a private copy of the conversion, and load the graph again (measured on
SmolLM2: about 0.5 s to write, 0.5 s to load).

The mapping is checked, not assumed: `WritableConversion` refuses a conversion unless the starting
model's weights, mapped this way, reproduce every weight initializer of the builder's own output
byte for byte. A model the mapping does not cover (attention biases, MoE, untied embeddings
stored apart, a builder version that lays things out differently) fails there, naming the
initializers it could not account for, before any training step.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from toolkit.rollouts.ort import converted, open_model

WEIGHT_FREE = {"cos_cache", "sin_cache"}  # rotary tables: computed by the builder, not weights


def initializer_layout(conversion: Path) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    """Initializer name -> (offset, length in bytes, shape) in the conversion's external data file."""
    import onnx

    graph = onnx.load(str(conversion / "model.onnx"), load_external_data=False).graph
    layout = {}
    for init in graph.initializer:
        ext = {e.key: e.value for e in init.external_data}
        if ext.get("location") != "model.onnx.data" or init.data_type != onnx.TensorProto.FLOAT:
            raise ValueError(f"{conversion}: initializer {init.name} is not a float32 tensor in model.onnx.data; "
                             "only float32 conversions can be refreshed in place")
        layout[init.name] = (int(ext.get("offset", 0)), int(ext["length"]), tuple(init.dims))
    return layout


def builder_tensors(state_dict: dict, num_layers: int) -> dict[str, np.ndarray]:
    """The trainer's weights as the model builder lays out a Llama-family decoder (float32). The
    layout was read off the builder's output for SmolLM2 and Qwen3; WritableConversion checks it."""
    def arr(name):
        return state_dict[name].detach().to("cpu").float().numpy()

    out = {}
    for i in range(num_layers):
        layer = f"model.layers.{i}."  # the builder keeps HF's layer prefix; the rest of the names differ
        out[layer + "input_layernorm.weight"] = arr(layer + "input_layernorm.weight")
        out[layer + "post_attention_layernorm.weight"] = arr(layer + "post_attention_layernorm.weight")
        out[layer + "attn.qkv_proj.MatMul.weight"] = np.concatenate(
            [arr(layer + f"self_attn.{x}_proj.weight") for x in "qkv"]).T
        out[layer + "attn.o_proj.MatMul.weight"] = arr(layer + "self_attn.o_proj.weight").T
        for x in ("q", "k"):  # Qwen3's per-head norms
            if layer + f"self_attn.{x}_norm.weight" in state_dict:
                out[layer + f"attn.{x}_norm.layernorm.weight"] = arr(layer + f"self_attn.{x}_norm.weight")
        for x in ("gate", "up", "down"):
            out[layer + f"mlp.{x}_proj.MatMul.weight"] = arr(layer + f"mlp.{x}_proj.weight").T
    out[f"model.layers.{num_layers}.final_norm_layernorm.weight"] = arr("model.norm.weight")
    out["lm_head.MatMul.weight"] = arr("lm_head.weight" if "lm_head.weight" in state_dict
                                       else "model.embed_tokens.weight").T
    return out


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


def model_weights(model_dir: str) -> tuple[dict, int]:
    """The weights a model directory holds (its safetensors files) and its number of layers."""
    import json

    from safetensors.torch import load_file

    weights = {}
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        weights.update(load_file(shard))
    return weights, json.loads((Path(model_dir) / "config.json").read_text())["num_hidden_layers"]


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
        try:
            mapped = builder_tensors(starting if starting is not None else weights, self.num_layers)
        except KeyError as missing:
            raise ValueError(f"{model_dir}: weight {missing} missing; in-place refresh knows the Llama family only") from None
        unmapped = sorted(set(self.layout) - set(mapped) - WEIGHT_FREE)
        unknown = sorted(set(mapped) - set(self.layout))
        data = np.memmap(self.dir / "model.onnx.data", dtype=np.uint8, mode="r")
        differ = sorted(k for k, v in mapped.items() if k in self.layout and not np.array_equal(self._read(data, k), v))
        del data
        if unmapped or unknown or differ:
            raise ValueError(f"{model_dir}: its ONNX Runtime GenAI conversion is laid out in a way the in-place "
                             f"refresh does not know (initializers not mapped: {unmapped[:4]}; mapped but absent: "
                             f"{unknown[:4]}; different bytes: {differ[:4]}): use rollout: hf")

    def _read(self, data, name: str) -> np.ndarray:
        offset, length, shape = self.layout[name]
        return np.frombuffer(data[offset:offset + length], dtype=np.float32).reshape(shape)

    def load(self, state_dict: dict | None = None):
        """The graph with `state_dict`'s weights written in (None: as it is), loaded afresh. The
        caller drops its previous model first: the file is rewritten under it."""
        if state_dict is not None:
            with open(self.dir / "model.onnx.data", "r+b") as f:
                for name, value in builder_tensors(state_dict, self.num_layers).items():
                    offset, length, shape = self.layout[name]
                    if value.shape != shape:
                        raise ValueError(f"weight {name}: shape {value.shape}, the graph's {shape}")
                    f.seek(offset)
                    f.write(np.ascontiguousarray(value, dtype=np.float32).tobytes())
        return open_model(self.dir, self.threads)
