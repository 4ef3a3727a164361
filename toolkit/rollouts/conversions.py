"""Conversions made from a checked one. Every model a recipe's stages save after the first has the
same architecture as the one before it, only other weights, and an engine's converter spends seconds
rebuilding the same graph for each (ONNX Runtime GenAI's builder 7-10 s, optimum-intel's OpenVINO
export about 13 s for SmolLM2 here). So an engine records its converter's output for one model as the
template of that model's architecture key, once it has checked that the model's own weights, laid
out the engine's way, reproduce the output's weight bytes; the next model with the same key gets a
copy of the template with its weights written in (toolkit.rollouts.ort_layout, ov_layout).

The key is every small file of the model folder a converter reads or copies (config, generation
config, tokenizer, chat template) and the converter's version: two models that agree on them convert
to the same graph with their own weights in its data file. The pointer to a template is a JSON file
under `<conversions>/.templates/`; the template itself is an ordinary conversion in the cache, so the
cache's pruning can drop it, and then the next model of the kind goes through the converter again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from toolkit.core.files import write_json_atomic

TEMPLATES = ".templates"  # <conversions>/.templates/<architecture key>.json
# what converters read besides the weights (config.json, generation_config.json) and copy beside the
# graph (tokenizer, chat template); a model's safetensors index only names its weights
ARCHITECTURE_SUFFIXES = (".json", ".jinja", ".txt", ".model")


def architecture_key(model_dir: str, converter: str) -> str:
    """What a conversion by `converter` (its name and version) holds besides the weights' values."""
    digest = hashlib.sha256(converter.encode())
    for path in sorted(Path(model_dir).iterdir()):
        if path.is_file() and path.suffix in ARCHITECTURE_SUFFIXES and not path.name.endswith(".index.json"):
            digest.update(f"{path.name}|{path.stat().st_size}|".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def record(conversion: Path, model_dir: str, converter: str, **layout) -> None:
    """`conversion` (in its cache folder) becomes the template of `model_dir`'s architecture; `layout`
    is whatever the engine needs to write another model's weights into a copy of it."""
    write_json_atomic(conversion.parent / TEMPLATES / f"{architecture_key(model_dir, converter)}.json",
                      {"conversion": conversion.name, "checked_with": str(model_dir), **layout})


def copy_of_template(model_dir: str, converter: str, root: Path, out: Path,
                     write: Callable[[Path, dict], None]) -> bool:
    """`out` made from the template recorded for `model_dir`'s architecture in the cache `root`: the
    template's files copied, then `write(out, pointer)` puts this model's weights in (raising
    ValueError, KeyError or OSError when they do not fit). False, and nothing left in `out`, when
    there is no template, it was pruned, or the weights do not fit."""
    pointer = root / TEMPLATES / f"{architecture_key(model_dir, converter)}.json"
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
