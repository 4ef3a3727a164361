"""Stage kind `merge`: weight-space merging of same-architecture models (Kimi k1.5's long2short
merge averages a long-CoT and a short-CoT model).

- linear: sum_i w_i * theta_i with the weights normalised to sum to 1.
- slerp: two models, spherical interpolation per tensor at `t` (linear where the two tensors are
  nearly parallel, where slerp is numerically undefined).
- ties (Yadav et al. 2023): task vectors against `base`, each trimmed to its top `density` share by
  magnitude, a sign elected per parameter by total mass, and the agreeing values averaged; the
  merged task vector is scaled by `scale` and added to the base.
A small implementation instead of mergekit, whose pinned dependencies do not fit this project's.
Models must share architecture, parameter names and shapes, and tokenizer vocabulary; anything else
is refused naming both models. The first model's tokenizer and config are saved with the result.
"""

from __future__ import annotations

import shutil
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from stages.common import StageBase
from stages.contracts import StageOutput


class MergeConfig(StageBase):
    kind: Literal["merge"] = "merge"
    models: list[str] = Field(min_length=2, description="models to merge: `stage.model`, named models, paths")
    method: Literal["linear", "slerp", "ties"] = "linear"
    weights: list[float] | None = Field(None, description="linear/ties: one weight per model (default equal)")
    t: float = Field(0.5, ge=0, le=1, description="slerp: 0 = the first model, 1 = the second")
    base: str | None = Field(None, description="ties: the model the task vectors are taken against")
    density: float = Field(0.5, gt=0, le=1, description="ties: share of each task vector kept")
    scale: float = Field(1.0, gt=0, description="ties: scale of the merged task vector")
    trust_remote_code: bool = False

    OUTPUTS: ClassVar[tuple[str, ...]] = ("model",)
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = ("models", "base")

    @model_validator(mode="after")
    def _method_fields(self):
        if self.weights is not None and len(self.weights) != len(self.models):
            raise ValueError(f"{len(self.weights)} weights for {len(self.models)} models")
        if self.weights is not None and sum(self.weights) <= 0:
            raise ValueError("weights must sum to more than 0")
        if self.method == "slerp" and len(self.models) != 2:
            raise ValueError("slerp merges exactly two models")
        if self.method == "ties" and self.base is None:
            raise ValueError("ties needs `base`, the model the task vectors are taken against")
        return self


def merge_tensors(tensors: list, method: str, weights: list[float], t: float = 0.5, base=None,
                  density: float = 0.5, scale: float = 1.0):
    """One merged tensor from the same tensor of every model."""
    import torch

    if method == "linear":
        total = sum(weights)
        return sum(w / total * x.float() for w, x in zip(weights, tensors))
    if method == "slerp":
        a, b = (x.float() for x in tensors)
        na, nb = a.flatten().norm(), b.flatten().norm()
        if na == 0 or nb == 0:
            return (1 - t) * a + t * b
        cos = torch.clamp((a.flatten() @ b.flatten()) / (na * nb), -1.0, 1.0)
        omega = torch.arccos(cos)
        if omega.abs() < 1e-4:  # nearly parallel: slerp tends to lerp
            return (1 - t) * a + t * b
        return (torch.sin((1 - t) * omega) * a + torch.sin(t * omega) * b) / torch.sin(omega)
    base = base.float()
    deltas = []
    for w, x in zip(weights, tensors):
        delta = x.float() - base
        k = max(1, int(round(density * delta.numel())))
        if k < delta.numel():  # keep the top-k by magnitude
            threshold = delta.abs().flatten().kthvalue(delta.numel() - k + 1).values
            delta = torch.where(delta.abs() >= threshold, delta, torch.zeros_like(delta))
        deltas.append(w * delta)
    stacked = torch.stack(deltas)
    sign = torch.sign(stacked.sum(dim=0))
    agree = (torch.sign(stacked) == sign) & (stacked != 0)
    merged = (stacked * agree).sum(dim=0) / agree.sum(dim=0).clamp(min=1)
    return base + scale * merged


def check_compatible(names: list[str], models: list, tokenizers: list) -> None:
    """Refuse models that cannot be merged, naming the pair that differs and how."""
    first, ref, ref_tok = names[0], models[0], tokenizers[0]
    ref_shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    for name, model, tok in zip(names[1:], models[1:], tokenizers[1:]):
        if model.config.architectures != ref.config.architectures:
            raise ValueError(f"cannot merge {first} ({ref.config.architectures}) with {name} "
                             f"({model.config.architectures}): architectures differ")
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        if shapes != ref_shapes:
            diff = sorted(set(shapes.items()) ^ set(ref_shapes.items()))[:3]
            raise ValueError(f"cannot merge {first} with {name}: parameter names or shapes differ, e.g. {diff}")
        if tok.get_vocab() != ref_tok.get_vocab():
            raise ValueError(f"cannot merge {first} with {name}: their tokenizers' vocabularies differ")


def run(cfg: MergeConfig, ctx) -> StageOutput:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths = [ctx.input(f"models.{i}") for i in range(len(cfg.models))]
    base_path = ctx.input("base") if cfg.base else None
    load = lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32, trust_remote_code=cfg.trust_remote_code)
    tok = lambda p: AutoTokenizer.from_pretrained(p, trust_remote_code=cfg.trust_remote_code)
    models, tokenizers = [load(p) for p in paths], [tok(p) for p in paths]
    names = list(cfg.models)
    base_model = load(base_path) if base_path else None
    if base_model is not None:
        check_compatible([*names, cfg.base], [*models, base_model], [*tokenizers, tok(base_path)])
    else:
        check_compatible(names, models, tokenizers)
    weights = cfg.weights or [1.0] * len(models)
    states = [m.state_dict() for m in models]
    base_state = base_model.state_dict() if base_model is not None else None
    merged = {}
    with torch.no_grad():
        for key, value in states[0].items():
            if not value.is_floating_point():
                merged[key] = value
                continue
            merged[key] = merge_tensors([s[key] for s in states], cfg.method, weights, cfg.t,
                                        base_state[key] if base_state else None, cfg.density,
                                        cfg.scale).to(value.dtype)
    models[0].load_state_dict(merged)
    out, tmp = ctx.output_dir / "model", ctx.output_dir / "model.tmp"
    for stale in (out, tmp):  # a rerun after a crash starts over: merging has no checkpoints
        shutil.rmtree(stale, ignore_errors=True)
    models[0].save_pretrained(tmp)
    tokenizers[0].save_pretrained(tmp)
    tmp.rename(out)
    metrics = {"merge/models": float(len(models)), **{f"merge/weight/{i}": w for i, w in enumerate(weights)}}
    return StageOutput(outputs={"model": "model"}, metrics=metrics, tags={"posttrain.merge_method": cfg.method})
