"""Conversions made from a checked one. Every model a recipe's stages save after the first has the
same architecture as the one before it, only other weights, and an engine's converter spends seconds
rebuilding the same graph for each (ONNX Runtime GenAI's builder 7-10 s, optimum-intel's OpenVINO
export about 13 s for SmolLM2 here). So an engine records its converter's output for one model as the
template of that model's architecture key, once it has checked that the model's own weights, laid
out the engine's way, reproduce the output's weight bytes; the next model with the same key gets a
copy of the template with its weights written in (toolkit.rollouts.ort_layout, ov_layout).

The key is every small file of the model folder a converter reads or copies (config, generation
config, tokenizer, chat template) and the converter's version: two models that agree on them convert
to the same graph with their own weights in its data file. An engine may name config keys its
converter copies into its own config and nothing else (`free_keys`: OpenVINO's exporter and
`use_cache`, which every trainer saves false and the base model's config has true): their values are
left out of the key, and the engine writes the model's own values into the copy. The pointer to a
template is a JSON file under `<conversions>/.templates/`; the template itself is an ordinary
conversion in the cache, so the cache's pruning can drop it, and then the next model of the kind goes
through the converter again.
Both engines read a model folder's weights (`model_weights`) and write weights into a conversion's
data file (`write_tensors`) the same way; GRPO's in-place refresh (ort_weights) writes through it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from toolkit.core.files import write_json_atomic

TEMPLATES = ".templates"  # <conversions>/.templates/<architecture key>.json
# what converters read besides the weights (config.json, generation_config.json) and copy beside the
# graph (tokenizer, chat template); a model's safetensors index only names its weights
ARCHITECTURE_SUFFIXES = (".json", ".jinja", ".txt", ".model")
# ...but not posttrain's own marker of a built named model (its name, revision and checksum), which no
# converter reads: with it in the key, a recipe's base model and its first trained model never shared one
NOT_READ_BY_CONVERTERS = ("posttrain_model.json",)


FREE = "<the model's own>"  # what a free key's value becomes in the key


def architecture_key(model_dir: str, converter: str, free_keys: tuple[str, ...] = ()) -> str:
    """What a conversion by `converter` (its name and version) holds besides the weights' values and
    the values of the config's `free_keys` (whether the config has each is still part of it)."""
    digest = hashlib.sha256(converter.encode())
    for path in sorted(Path(model_dir).iterdir()):
        if (path.is_file() and path.suffix in ARCHITECTURE_SUFFIXES and not path.name.endswith(".index.json")
                and path.name not in NOT_READ_BY_CONVERTERS):
            data = path.read_bytes()
            if path.name == "config.json" and free_keys:
                config = json.loads(data)
                data = json.dumps({k: FREE if k in free_keys else v for k, v in config.items()}, sort_keys=True).encode()
            digest.update(f"{path.name}|{len(data)}|".encode())
            digest.update(data)
    return digest.hexdigest()[:20]


def record(conversion: Path, model_dir: str, converter: str, free_keys: tuple[str, ...] = (), **layout) -> None:
    """`conversion` (in its cache folder) becomes the template of `model_dir`'s architecture; `layout`
    is whatever the engine needs to write another model's weights into a copy of it."""
    write_json_atomic(conversion.parent / TEMPLATES / f"{architecture_key(model_dir, converter, free_keys)}.json",
                      {"conversion": conversion.name, "checked_with": str(model_dir), **layout})


def copy_of_template(model_dir: str, converter: str, root: Path, out: Path,
                     write: Callable[[Path, dict], None], free_keys: tuple[str, ...] = ()) -> bool:
    """`out` made from the template recorded for `model_dir`'s architecture in the cache `root`: the
    template's files copied, then `write(out, pointer)` puts this model's weights (and the values of
    its free keys) in, raising ValueError, KeyError or OSError when they do not fit. False, and
    nothing left in `out`, when there is no template, it was pruned, or the weights do not fit."""
    pointer = root / TEMPLATES / f"{architecture_key(model_dir, converter, free_keys)}.json"
    if not pointer.exists():
        return False
    recorded = json.loads(pointer.read_text())
    template = root / recorded["conversion"]
    try:
        shutil.copytree(template, out)
        write(out, recorded)
        os.utime(template)  # recently used: the cache's pruning keeps it
        return True
    except (OSError, KeyError, ValueError):  # pruned while copied, another family, other shapes
        shutil.rmtree(out, ignore_errors=True)
        return False


def model_weights(model_dir: str) -> tuple[dict, int]:
    """The weights a model directory holds (its safetensors files) and its number of layers."""
    from safetensors.torch import load_file

    weights = {}
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        weights.update(load_file(shard))
    return weights, json.loads((Path(model_dir) / "config.json").read_text())["num_hidden_layers"]


def write_tensors(conversion: Path, layout: dict, tensors: dict[str, np.ndarray],
                  data_file: str = "model.onnx.data") -> None:
    """Each tensor copied straight into its place (`layout`: name -> offset, bytes, shape) in the
    conversion's data file, through a shared memory map: torch copies a transposed weight in blocks
    over its threads, with no contiguous copy or byte string between (0.38 s for SmolLM2 here, against
    0.66-0.79 s through `tobytes` and `write`). The graph loaded next reads the same pages."""
    import torch

    data = np.memmap(conversion / data_file, dtype=np.uint8, mode="r+")
    try:
        for name, value in tensors.items():
            offset, length, shape = layout[name]
            if value.shape != shape:
                raise ValueError(f"weight {name}: shape {value.shape}, the graph's {shape}")
            target = np.ndarray(shape, dtype=np.float32, buffer=data, offset=offset)
            torch.from_numpy(target).copy_(torch.from_numpy(np.asarray(value, dtype=np.float32)))
    finally:
        del data
