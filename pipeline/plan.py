"""Planning a stage, before anything runs: resolve its inputs (upstream outputs, named models,
data sources), fingerprint them, decide whether it is evaluated, and derive its cache key and
output directory. The key is a hash of the stage's kind, resolved config (less gate and registry,
which judge the result rather than make it), evaluation spec, input fingerprints, launcher shape
and code version (the closure of the modules its kind imports): equal keys mean equal work.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from data_curation.sources import source_fingerprint
from pipeline.gates import baseline_plan, reused_evaluations
from pipeline.models.named import resolve_with_fingerprint
from pipeline.recipe import ResolvedRecipe
from pipeline.recipe_checks import deepspeed_config_path, is_evaluated
from pipeline.store.home import home
from stages.contracts import Lineage, StagePlan, StageResult
from stages.evaluate import reference_spec
from stages.launch import launch_key
from stages.registry import STAGE_KINDS


def plan_stage(resolved: ResolvedRecipe, stage, upstream: dict[str, StageResult]) -> StagePlan:
    """Resolve a stage's inputs, decide whether it is evaluated, and compute its cache key. Builds
    named models if needed."""
    inputs, fingerprints, lineage = {}, {}, {}
    refs = {r for _, r, _ in stage.refs()}
    for fname, ref in stage.model_inputs().items():
        if ref in refs:
            up = upstream[ref.split(".")[0]]
            inputs[fname] = str(Path(up.output_dir) / up.outputs["model"])
            fingerprints[fname] = up.fingerprints["model"]
            lineage[fname] = Lineage(type="model", name=ref, source=inputs[fname], digest=fingerprints[fname],
                                     upstream_run=up.mlflow_run_id)
        else:
            inputs[fname], fingerprints[fname] = resolve_with_fingerprint(ref)
            lineage[fname] = Lineage(type="model", name=ref, source=inputs[fname], digest=fingerprints[fname])
    for fname, spec in stage.data_inputs().items():
        if spec.stage_ref:
            upstream_name, output = spec.stage_ref.split(".", 1)
            up = upstream[upstream_name]
            inputs[fname] = {"path": str(Path(up.output_dir) / up.outputs[output]), "n": spec.n}
            fingerprints[fname] = up.fingerprints[output]
            lineage[fname] = Lineage(type="dataset", name=spec.stage_ref, source=inputs[fname]["path"],
                                     digest=_rows_digest(fingerprints[fname], spec), rows=spec.n,
                                     upstream_run=up.mlflow_run_id)
        else:
            inputs[fname] = spec.model_dump(mode="json")
            fingerprints[fname] = source_fingerprint(spec.source, spec.params)
            name = spec.params["path"] if spec.source == "file" else spec.source
            lineage[fname] = Lineage(type="dataset", name=name, source=_source_uri(spec),
                                     digest=_rows_digest(fingerprints[fname], spec), rows=spec.n)
    fingerprints.update(stage.input_fingerprints())
    eval_spec = None
    if is_evaluated(resolved.recipe, stage):
        whole = resolved.recipe.eval
        eval_spec = (reference_spec(whole) if stage.evaluate == "greedy" else whole).model_dump(mode="json")
        data = resolved.recipe.eval.data
        inputs["eval_data"] = eval_spec["data"]
        fingerprints["eval_data"] = source_fingerprint(data.source, data.params)
        lineage["eval_data"] = Lineage(type="dataset", name=data.source, source=_source_uri(data),
                                       digest=_rows_digest(fingerprints["eval_data"], data), rows=data.n, context="eval")
    config = stage.model_dump(mode="json")
    # gate and registry judge or file the result, not make it
    keyed = {**stage.model_dump(mode="json", exclude={"gate", "registry"}), "launcher": launch_key(stage.launcher)}
    key_material = {"kind": stage.kind, "config": keyed, "eval": eval_spec, "inputs": fingerprints,
                    "code": STAGE_KINDS[stage.kind].code_version()}
    reused = reused_evaluations(stage, upstream) if eval_spec is not None else []
    if reused:  # what the worker measures itself (absent: the key every stage had before)
        key_material["reused_evals"] = reused
    key = hashlib.sha256(json.dumps(key_material, sort_keys=True).encode()).hexdigest()
    out = home() / "stages" / resolved.recipe.name / f"{stage.name}-{key[:16]}"
    if not (out / "result.json").exists():  # the same stage, published by another recipe (same key: same work)
        out = next((p.parent for p in sorted((home() / "stages").glob(f"*/{out.name}/result.json"))), out)
    ds = str(deepspeed_config_path(stage.launcher.deepspeed_config)) if stage.launcher.mode == "deepspeed" else None
    return StagePlan(name=stage.name, kind=stage.kind, recipe=resolved.recipe.name, config=config, inputs=inputs,
                     fingerprints=fingerprints, eval=eval_spec, cache_key=key, output_dir=str(out),
                     deepspeed_config=ds, launcher=stage.launcher, lineage=lineage,
                     baseline=baseline_plan(stage, eval_spec, fingerprints, upstream), reused_evals=reused)


def _rows_digest(fingerprint: str, spec) -> str:
    """The digest MLflow knows a dataset by: the source's content and code, and which rows were taken
    (MLflow keeps one dataset per name and digest, so two selections from a source need two)."""
    return hashlib.sha256(json.dumps([fingerprint, spec.model_dump(mode="json")], sort_keys=True).encode()).hexdigest()


def _source_uri(spec) -> str:
    """Where a named source's rows come from: the local file, or `posttrain:NAME?params`."""
    if spec.source == "file":
        return str(Path(spec.params["path"]).resolve())
    return f"posttrain:{spec.source}?split={spec.split}&seed={spec.seed}&params={json.dumps(spec.params, sort_keys=True)}"
