"""Baselines and evaluation gates.

Every evaluated stage is compared with the model it started from: the upstream stage's evaluation
when its input is an evaluated stage, otherwise the input model itself, its greedy pass evaluated
once (stages.evaluate.reference_spec; per model fingerprint and evaluation spec, cached in
$POSTTRAIN_HOME/baselines/) by the stage's worker
(a distillation stage's `before/` student evaluation is the same measurement, read from there, and
its `before/` and `teacher/` numbers are an upstream stage's when that stage evaluated the model). Those
numbers are the stage's `input/eval/...` metrics. Both sides were scored on the same prompts, and
their per-prompt scores are kept (`eval_scores.json`), so the change is a paired comparison:
`change/eval/<metric>` with its paired 95% interval (`_lo`, `_hi`), the prompts it rests on
(`_n`) and, for 0/1 scores, McNemar's exact p-value (`_p`); `posttrain compare` prints them.

A stage's `gate: {metric, min_delta, on_fail, significant}` then asks that the metric moved by at
least `min_delta` (with `significant: true`, that the LOWER end of the change's 95% interval is above
`min_delta`: the move is not noise): `stop` fails the pipeline with the numbers (the stage stays
published, so a rerun with a looser gate does not retrain it), `warn` tags the stage's MLflow run
and goes on.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.store.home import home
from stages.common import PAIRED_METRICS, GateSpec, paired_keys
from stages.contracts import StageResult
from stages.evaluate import EVAL_SCORES, INPUT_EVAL_SCORES, SWEEP_PREFIXES, EvalSpec, reference_spec
from toolkit.core.fingerprints import code_fingerprint
from toolkit.core.stats import paired_change

INPUT = "input/"
CHANGE = "change/"


class GateFailed(RuntimeError):
    pass


def is_eval(key: str) -> bool:
    return key.startswith("eval/")


def evaluated_upstream(stage, field: str | None, upstream: dict[str, StageResult]) -> StageResult | None:
    """The earlier stage whose model is this stage's model input `field`, when it was evaluated."""
    ref = next((r for path, r, _ in stage.refs() if field is not None and path == field), None)
    up = upstream.get(ref.split(".")[0]) if ref else None
    return up if up is not None and any(is_eval(k) for k in up.metrics) else None


def evaluated_input_stage(stage, upstream: dict[str, StageResult]) -> StageResult | None:
    """The earlier stage whose model is this stage's input (EVAL_INPUT), when it was evaluated."""
    return evaluated_upstream(stage, stage.EVAL_INPUT, upstream)


def reused_evaluations(stage, upstream: dict[str, StageResult]) -> list[str]:
    """The REFERENCE_EVALS fields an upstream stage already evaluated (on the same held-out set: the
    recipe has one): the worker does not evaluate those models again, the flow reports the upstream's
    greedy numbers (reference_metrics). qwen3 on demo evaluated three models again: general_rl's,
    as each distillation's teacher, and distill_off's, as distill_on's student."""
    return sorted(f for f in stage.REFERENCE_EVALS if evaluated_upstream(stage, f, upstream) is not None)


def reference_metrics(stage, upstream: dict[str, StageResult]) -> dict[str, float]:
    """`<label>/eval/...` for each reused evaluation: the upstream's greedy-pass metrics (its sweeps
    are not what a reference model reports: stages.evaluate.reference_spec)."""
    out: dict[str, float] = {}
    for field, label in stage.REFERENCE_EVALS.items():
        if (up := evaluated_upstream(stage, field, upstream)) is not None:
            out.update({f"{label}/{k}": v for k, v in up.metrics.items() if is_eval(k) and not k.startswith(SWEEP_PREFIXES)})
    return out


def baseline_plan(stage, eval_spec: dict | None, fingerprints: dict[str, str],
                  upstream: dict[str, StageResult]) -> dict | None:
    """{input, eval, path} when the worker must evaluate the stage's input model with `eval` (its
    greedy pass, plus the sweeps when the stage's gate reads one: reference_spec), cached at `path`,
    which is keyed by that spec; None when there is nothing to compare or the upstream stage's
    evaluation serves."""
    if eval_spec is None or stage.EVAL_INPUT is None or evaluated_input_stage(stage, upstream):
        return None
    reference = reference_spec(EvalSpec.model_validate(eval_spec), stage.gate.metric if stage.gate else None)
    reference_json = reference.model_dump(mode="json")
    material = {"model": fingerprints[stage.EVAL_INPUT], "eval": reference_json, "eval_data": fingerprints["eval_data"],
                "code": code_fingerprint(("stages.evaluate",))}
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    return {"input": stage.EVAL_INPUT, "eval": reference_json, "path": str(home() / "baselines" / f"{key}.json")}


def _scores(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def change_metrics(after: dict | None, before: dict | None) -> dict[str, float]:
    """`change/eval/<metric>` with its paired interval, n and (0/1 scores) McNemar p, over the
    prompts both evaluations scored (matched by row id): accuracy, format, tokens, pass@1, and the
    mean of each reward both scored (`change/eval/rewards/<name>/mean`)."""
    if not after or not before:
        return {}
    index = {row_id: i for i, row_id in enumerate(before["id"])}
    pairs = [(index[row_id], j) for j, row_id in enumerate(after["id"]) if row_id in index]
    out: dict[str, float] = {}
    for metric, key in paired_keys(after).items():
        if key not in before:  # pass_at_1: kept only by sampled evaluations; rewards: only where both scored them
            continue
        c = paired_change([before[key][i] for i, _ in pairs], [after[key][j] for _, j in pairs])
        out[CHANGE + metric] = c.pop("delta")
        out.update({f"{CHANGE}{metric}_{k}": v for k, v in c.items()})
    return out


def input_metrics(stage, result: StageResult, upstream: dict[str, StageResult]) -> dict[str, float]:
    """The input model's held-out metrics as `input/eval/...` (from the worker's baseline, or from the
    upstream stage that produced the input model), the paired change against it (`change/...`), and
    the reference models' numbers an upstream evaluation serves (reference_metrics)."""
    if not any(is_eval(k) for k in result.metrics):
        return {}
    references = reference_metrics(stage, upstream)
    up = evaluated_input_stage(stage, upstream)
    own = {k: v for k, v in result.metrics.items() if k.startswith(INPUT)}
    if not own and up is not None:
        own = {INPUT + k: v for k, v in up.metrics.items() if is_eval(k)}
    before = _scores(Path(result.output_dir) / INPUT_EVAL_SCORES) or (
        _scores(Path(up.output_dir) / EVAL_SCORES) if up is not None else None)
    return {**own, **change_metrics(_scores(Path(result.output_dir) / EVAL_SCORES), before), **references}


def candidate_refusal(new_dir: Path, old_dir: Path | None) -> str | None:
    """Why a new registry version must not take `candidate` from the version it would replace: its
    held-out accuracy on the prompts both were scored on is significantly lower (the paired 95%
    interval of the change lies below 0). None when it may: no earlier candidate, the same output,
    or no shared held-out prompts to compare on (nothing measured is nothing refused)."""
    if old_dir is None or Path(old_dir).resolve() == Path(new_dir).resolve():
        return None
    change = change_metrics(_scores(Path(new_dir) / EVAL_SCORES), _scores(Path(old_dir) / EVAL_SCORES))
    key = CHANGE + "eval/accuracy"
    if not change.get(f"{key}_n") or change[f"{key}_hi"] >= 0:
        return None
    return (f"held-out accuracy {change[key]:+.3f} [{change[f'{key}_lo']:+.3f}, {change[f'{key}_hi']:+.3f}] on "
            f"{int(change[f'{key}_n'])} prompts against the candidate from {old_dir}")


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
    if gate.significant:
        lo, hi = metrics.get(f"{CHANGE}{gate.metric}_lo"), metrics.get(f"{CHANGE}{gate.metric}_hi")
        if lo is None:
            return (f"gate on stage {stage_name}: significant: true needs a paired comparison of {gate.metric}, "
                    f"and there is none (paired: {sorted(PAIRED_METRICS)})")
        if lo <= gate.min_delta:
            return (f"gate on stage {stage_name}: {gate.metric} changed by {delta:+.4g}, 95% interval "
                    f"[{lo:+.4g}, {hi:+.4g}] on {metrics.get(f'{CHANGE}{gate.metric}_n', 0):.0f} prompts: not "
                    f"significantly above {gate.min_delta:+.4g}")
    return None
