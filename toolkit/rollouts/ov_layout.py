"""Where optimum-intel's OpenVINO export puts a model's weights, and a new model's conversion made
from a checked one (toolkit.rollouts.conversions): a copy of the exported IR with the new weights
written in, about a second for SmolLM2 against the exporter's 13 s.

The IR (`openvino_model.xml`) names every constant's element type and its offset and size in
`openvino_model.bin`. In float32 the exporter stores each weight as torch holds it (matrices
[out, in], named after their module; norm weights anonymous, shaped [1, 1, hidden]). That is read
off a model's own export, by value, not assumed from names, because the export depends on the values
as well as the architecture: a norm whose weight is exactly ones is folded away (the tiny test models'
are), and another exporter version may fold, transpose or fuse something else. A conversion becomes
a template only if
- each of its model's weights sits, byte for byte, in exactly one float32 constant, whose bytes no
  other constant shares (the serializer stores equal constants once);
- no float32 constant as large as the smallest weight is left unaccounted for. What remains is the
  exporter's own: scalars and the RoPE frequencies, fixed by the config, which is part of the key.
Its layout (weight name -> offset, bytes, shape) is recorded with it.

`use_cache` is a free key of the architecture (toolkit.rollouts.conversions): the exporter traces the
graph with its KV cache whatever the config says and only copies the value into its `config.json`.
A trainer saves it false and the base model has it true, so without this the first trained model of
every recipe went through the exporter again (about 15 s); the copy gets the model's own value,
written as the exporter writes its config (sorted keys, indent 2), which the template's own file must
read back to byte for byte, or the model goes through the exporter.
"""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from toolkit.rollouts.conversions import copy_of_template, model_weights, record, write_tensors

DATA_FILE = "openvino_model.bin"
FREE_KEYS = ("use_cache",)


def constants(conversion: Path) -> list[tuple[str, str, int, int]]:
    """(name, element type, offset, bytes) of every constant of the conversion's IR."""
    layers = ET.parse(conversion / "openvino_model.xml").getroot().find("layers")
    out = []
    for layer in layers if layers is not None else []:
        data = layer.find("data")
        if layer.get("type") == "Const" and data is not None:
            out.append((layer.get("name", ""), data.get("element_type", ""), int(data.get("offset", -1)),
                        int(data.get("size", -1))))
    return out


def exported_weights(model_dir: str) -> dict[str, np.ndarray]:
    """The model's weights in float32, as the exporter reads them: a tied output head is the
    embedding, not a weight of its own."""
    weights, _ = model_weights(model_dir)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if config.get("tie_word_embeddings", True):
        weights.pop("lm_head.weight", None)
    return {name: w.detach().to("cpu").float().numpy() for name, w in weights.items()}


def weight_layout(conversion: Path, weights: dict[str, np.ndarray]) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    """Where each of `weights` sits in the conversion's data file, found by its bytes; ValueError
    naming what does not fit the rules above."""
    consts = constants(conversion)
    per_offset = Counter(offset for _, _, offset, _ in consts)
    data = np.memmap(conversion / DATA_FILE, dtype=np.uint8, mode="r")
    try:
        by_bytes = defaultdict(list)
        for name, kind, offset, size in consts:
            if kind == "f32":
                by_bytes[hashlib.sha256(data[offset:offset + size]).digest()].append((name, offset, size))
    finally:
        del data
    layout, problems = {}, []
    for name, value in weights.items():
        found = by_bytes.get(hashlib.sha256(np.ascontiguousarray(value, dtype=np.float32)).digest(), [])
        if len(found) != 1 or per_offset[found[0][1]] != 1:
            problems.append(f"{name} in {len(found)} constants" + (" that share bytes" if len(found) == 1 else ""))
        else:
            layout[name] = (found[0][1], found[0][2], tuple(value.shape))
    if len(set(layout.values())) != len(layout):
        problems.append("two weights in one constant")
    smallest = min((v.size * 4 for v in weights.values()), default=0)
    placed = {offset for offset, _, _ in layout.values()}
    stray = [name for name, kind, offset, size in consts if kind == "f32" and size >= smallest and offset not in placed]
    if stray:
        problems.append(f"float32 constants that are no weight of the model: {stray[:3]}")
    if problems or not weights:
        raise ValueError(f"{conversion}: the export's weights are not laid out as templates need: "
                         f"{'; '.join(problems[:4]) or 'no weights'}")
    return layout


def record_template(model_dir: str, conversion: Path, converter: str) -> None:
    """The exporter's `conversion` of `model_dir` becomes its architecture's template (for exports by
    `converter`: OpenVINO's and the exporter's versions) when its weights' layout passes
    weight_layout (about 3 s for SmolLM2, once per architecture). A model whose export it does not
    pass keeps the exporter."""
    try:
        layout = weight_layout(conversion, exported_weights(model_dir))
    except (ValueError, OSError):
        return
    record(conversion, model_dir, converter, FREE_KEYS, weights={k: [o, n, list(s)] for k, (o, n, s) in layout.items()})


def from_template(model_dir: str, out: Path, root: Path, converter: str) -> bool:
    """`out` made from the template of `model_dir`'s architecture, its weights written in; False (and
    nothing in `out`) without a template, or when the weights are not the template's names and shapes."""
    def write(conversion: Path, recorded: dict) -> None:
        weights = exported_weights(model_dir)
        layout = {name: (offset, size, tuple(shape)) for name, (offset, size, shape) in recorded["weights"].items()}
        if set(weights) != set(layout):
            raise ValueError("the weights are not the template's")
        if any(value.nbytes != layout[name][1] for name, value in weights.items()):
            raise ValueError("a weight's size is not the template's")
        write_tensors(conversion, layout, weights, data_file=DATA_FILE)
        write_free_keys(conversion, model_dir)

    return copy_of_template(model_dir, converter, root, out, write, FREE_KEYS)


def write_free_keys(conversion: Path, model_dir: str) -> None:
    """The model's own values of the free keys in the conversion's `config.json`, written as the
    exporter (transformers' `to_json_string`) writes it; ValueError when the file would not come out
    as the exporter's or the two configs do not both hold a free key. A copy whose values are the
    model's already is left as it is."""
    path = conversion / "config.json"
    text = path.read_text()
    config, own = json.loads(text), json.loads((Path(model_dir) / "config.json").read_text())
    if any((key in config) != (key in own) for key in FREE_KEYS):
        raise ValueError(f"a free key of {FREE_KEYS} is in one config of two")
    changed = {key: own[key] for key in FREE_KEYS if key in own and own[key] != config[key]}
    if not changed:
        return
    if json.dumps(config, indent=2, sort_keys=True) + "\n" != text:
        raise ValueError(f"{path} is not written the way this copy would write it")
    path.write_text(json.dumps({**config, **changed}, indent=2, sort_keys=True) + "\n")
