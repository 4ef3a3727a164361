"""Where the ONNX Runtime GenAI model builder puts a Llama-family model's weights, and what that
allows: writing new weights into a built graph (GRPO's refresh, toolkit.rollouts.ort_weights) and
making a new model's conversion from a checked one (`from_template`).

The builder stores every weight as an initializer in the graph's external data file
(`model.onnx.data`), at an offset and length the graph names. For the Llama family (SmolLM2, Llama,
Qwen3) it writes each HF weight in a fixed way: MatMul weights transposed, q, k and v concatenated
into one `qkv_proj`, norms as they are (Qwen3's per-head q/k norms too), the tied embedding as
`lm_head`'s transposed weight (`builder_tensors`).

The mapping is checked, not assumed (`mapping_problem`): a model's weights, mapped this way, must
reproduce every weight initializer of the builder's own output byte for byte. A model the mapping
does not cover (attention biases, MoE, untied embeddings stored apart, a builder version that lays
things out differently) fails that check, naming the initializers it could not account for.

Templates (toolkit.rollouts.conversions): once the builder's float32 output for one model has passed
that check (`record_template`), another model of the same architecture key gets a copy of it with
its own weights written in (`from_template`): about a second for SmolLM2, against the builder's
7-10 s (benchmarks/RESULTS.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.rollouts.conversions import copy_of_template, model_weights, record, write_tensors

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
                             "only float32 conversions can take new weights in place")
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


def mapping_problem(conversion: Path, layout: dict, weights: dict, num_layers: int) -> str | None:
    """Why `weights`, mapped by builder_tensors, do not reproduce the conversion's weight
    initializers byte for byte (None when they do)."""
    try:
        mapped = builder_tensors(weights, num_layers)
    except KeyError as missing:
        return f"weight {missing} missing; in-place writing knows the Llama family only"
    unmapped = sorted(set(layout) - set(mapped) - WEIGHT_FREE)
    unknown = sorted(set(mapped) - set(layout))
    data = np.memmap(conversion / "model.onnx.data", dtype=np.uint8, mode="r")
    differ = sorted(k for k, v in mapped.items() if k in layout and not np.array_equal(_read(data, layout[k]), v))
    del data
    if unmapped or unknown or differ:
        return (f"its ONNX Runtime GenAI conversion is laid out in a way the in-place writing does not know "
                f"(initializers not mapped: {unmapped[:4]}; mapped but absent: {unknown[:4]}; different bytes: "
                f"{differ[:4]})")
    return None


def _read(data, where: tuple[int, int, tuple[int, ...]]) -> np.ndarray:
    offset, length, shape = where
    return np.frombuffer(data[offset:offset + length], dtype=np.float32).reshape(shape)


def _converter() -> str:
    import onnxruntime_genai as og

    return f"onnxruntime-genai {og.__version__}|float32"


def record_template(model_dir: str, conversion: Path) -> None:
    """The builder's float32 `conversion` of `model_dir` becomes the template for its architecture
    key when the model's own weights, mapped, reproduce its data file byte for byte (checked once per
    architecture, about a second for SmolLM2). A model the mapping does not cover gets no template:
    its kind keeps the builder."""
    try:
        weights, num_layers = model_weights(model_dir)
        if weights and not mapping_problem(conversion, initializer_layout(conversion), weights, num_layers):
            record(conversion, model_dir, _converter())
    except (ValueError, OSError):  # not float32 in the data file, unreadable weights: no template
        pass


def from_template(model_dir: str, out: Path, root: Path) -> bool:
    """`out` made as the builder would make it, from the recorded template of `model_dir`'s
    architecture key: the template's files copied and this model's weights written in. False (and
    nothing in `out`) when there is no template, it was pruned, or the weights do not fit its layout."""
    def write(conversion: Path, _recorded: dict) -> None:
        weights, num_layers = model_weights(model_dir)
        tensors = builder_tensors(weights, num_layers)
        layout = initializer_layout(conversion)
        if set(layout) - WEIGHT_FREE != set(tensors):
            raise ValueError("the weights do not cover the template's initializers")
        write_tensors(conversion, layout, tensors)

    return copy_of_template(model_dir, _converter(), root, out, write)
