"""Baselines and evaluation gates.

Every evaluated stage is compared with the model it started from: the upstream stage's evaluation
when its input is an evaluated stage, otherwise the input model itself, evaluated once (per model
fingerprint and evaluation spec, cached in $POSTTRAIN_HOME/baselines/) by the stage's worker
(a distillation stage's `before/` student evaluation is the same measurement, read from there). Those
numbers are the stage's `input/eval/...` metrics; `posttrain compare` shows the change.

A stage's `gate: {metric, min_delta, on_fail}` then asks that the metric moved by at least
`min_delta`: `stop` fails the pipeline with both numbers (the stage stays published, so a rerun
with a looser gate does not retrain it), `warn` tags the stage's MLflow run and goes on.
"""

from __future__ import annotations

import hashlib
import json

from pipeline.home import home
from stages.core.fingerprints import code_fingerprint
from stages.kinds.common import GateSpec
from stages.kinds.contracts import StageResult

INPUT = "input/"


class GateFailed(RuntimeError):
    pass


def is_eval(key: str) -> bool:
    return key.startswith("eval/")


def evaluated_input_stage(stage, upstream: dict[str, StageResult]) -> StageResult | None:
    """The earlier stage whose model is this stage's input (EVAL_INPUT), when it was evaluated."""
    ref = next((r for path, r, _ in stage.refs() if path == stage.EVAL_INPUT), None)
    up = upstream.get(ref.split(".")[0]) if ref else None
    return up if up is not None and any(is_eval(k) for k in up.metrics) else None


def baseline_plan(stage, eval_spec: dict | None, fingerprints: dict[str, str],
                  upstream: dict[str, StageResult]) -> dict | None:
    """{input, path} when the worker must evaluate the stage's input model (cached at `path`);
    None when there is nothing to compare or the upstream stage's evaluation serves."""
    if eval_spec is None or stage.EVAL_INPUT is None or evaluated_input_stage(stage, upstream):
        return None
    material = {"model": fingerprints[stage.EVAL_INPUT], "eval": eval_spec, "eval_data": fingerprints["eval_data"],
                "code": code_fingerprint(("stages.kinds.evaluate",))}
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    return {"input": stage.EVAL_INPUT, "path": str(home() / "baselines" / f"{key}.json")}


def input_metrics(stage, result: StageResult, upstream: dict[str, StageResult]) -> dict[str, float]:
    """The input model's held-out metrics as `input/eval/...`: from the worker's baseline, or from
    the upstream stage that produced the input model."""
    own = {k: v for k, v in result.metrics.items() if k.startswith(INPUT)}
    if own or not any(is_eval(k) for k in result.metrics):
        return own
    up = evaluated_input_stage(stage, upstream)
    return {INPUT + k: v for k, v in up.metrics.items() if is_eval(k)} if up else {}


def gate_failure(stage_name: str, gate: GateSpec, metrics: dict[str, float]) -> str | None:
    """Why the gate fails, with both numbers; None when it passes."""
    after, before = metrics.get(gate.metric), metrics.get(INPUT + gate.metric)
    if after is None or before is None:
        return (f"gate on stage {stage_name}: {gate.metric} is not measured "
                f"({'stage' if after is None else 'input model'}); measured: "
                f"{sorted(k for k in metrics if is_eval(k))[:12]}")
    delta = after - before
    if delta + 1e-12 < gate.min_delta:
        return (f"gate on stage {stage_name}: {gate.metric} {after:.4g} against the input model's {before:.4g} "
                f"(change {delta:+.4g}; the gate asks for at least {gate.min_delta:+.4g})")
    return None
