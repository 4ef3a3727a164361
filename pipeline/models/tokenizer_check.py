"""Validation: a distillation student and its teacher must share one vocabulary (their logits are
compared token by token, and the teacher's traces are the student's training text).

Either side may be an earlier stage's model. Our stages never change a tokenizer, so a stage's model
has the tokenizer of the model it trained (its EVAL_INPUT field), followed back to a model the recipe
names. Named models compare by their tokenizer family, without building anything. Other local models
compare by the vocabulary in their tokenizer.json (read as JSON: no transformers import). A side that
cannot be read here (an MLflow URI, a model without tokenizer.json) is checked by the worker instead
(stages.distill.check_same_tokenizer), before it trains."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.models.named import NAMED_MODELS, looks_like_hub_id, models_dir


def base_model(stages: dict, ref: str) -> str:
    """The model a reference's tokenizer comes from: `stage.model` followed back through the stages."""
    seen = set()
    while "." in ref and "/" not in ref and ref.split(".", 1)[0] in stages and ref not in seen:
        seen.add(ref)
        producer = stages[ref.split(".", 1)[0]]
        field = producer.EVAL_INPUT or (producer.MODEL_FIELDS[0] if producer.MODEL_FIELDS else None)
        value = getattr(producer, field, None) if field else None
        if isinstance(value, list):
            value = value[0] if value else None
        if not isinstance(value, str):
            break
        ref = value
    return ref


def _tokenizer_json(ref: str) -> Path | None:
    path = Path(ref).expanduser()
    if path.is_dir():
        return path / "tokenizer.json" if (path / "tokenizer.json").is_file() else None
    if looks_like_hub_id(ref):
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(ref, "tokenizer.json")
        return Path(found) if isinstance(found, str) else None
    return None


def vocabulary(ref: str, by_family: bool = True) -> tuple[str, str] | None:
    """("family", name) for a named model (with `by_family`), ("vocab", digest) for a readable
    tokenizer.json (a named model's once built), else None."""
    if ref in NAMED_MODELS:
        if by_family:
            return "family", NAMED_MODELS[ref].tokenizer
        ref = str(models_dir() / ref)
    path = _tokenizer_json(ref)
    if path is None:
        return None
    data = json.loads(path.read_text())
    added = sorted((t["id"], t["content"]) for t in data.get("added_tokens", []))
    material = json.dumps([data.get("model", {}).get("vocab"), added], sort_keys=True)
    return "vocab", hashlib.sha256(material.encode()).hexdigest()


def distill_tokenizer_errors(stages: list) -> list[tuple[int, str]]:
    """(stage index, message) for every distillation stage whose student and teacher are known to
    have different vocabularies."""
    by_name = {s.name: s for s in stages}
    errors = []
    for i, stage in enumerate(stages):
        if stage.kind != "distill":
            continue
        student, teacher = base_model(by_name, stage.student), base_model(by_name, stage.teacher)
        a, b = vocabulary(student), vocabulary(teacher)
        if a and b and a[0] != b[0]:  # a named model against a directory: compare vocabularies if built
            a, b = vocabulary(student, by_family=False), vocabulary(teacher, by_family=False)
        if a and b and a != b:
            errors.append((i, f"student {stage.student} and teacher {stage.teacher} have different tokenizers "
                              f"({_describe(stage.student, student, a)} vs {_describe(stage.teacher, teacher, b)}); "
                              "distillation here needs the same vocabulary"))
    return errors


def _describe(ref: str, base: str, key: tuple[str, str]) -> str:
    origin = f"{base}'s" if base != ref else "its"
    return f"{origin} {key[1]} tokenizer" if key[0] == "family" else f"{origin} vocabulary {key[1][:12]}"
