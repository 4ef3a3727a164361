"""`posttrain eval`: evaluate any model on any data source, outside a recipe, with the same code a
stage's evaluation runs (stages.evaluate), and compare models on the same prompts.

    posttrain eval MODEL [MODEL ...] --data SOURCE[:SPLIT] [--n N] [--reward NAME[:k=v,...]]...
                   [--mode think|no_think]... [--budget N]... [--samples K] [--json] [--out DIR]

MODEL is a named model (`tiny-qwen3`), a directory, a stage output (`RUN/STAGE`, `latest/STAGE`
or `STAGE@latest`), or an MLflow URI (`models:/name@alias`, `models:/name/3`, `runs:/<run>/model`).
Each (model fingerprint, evaluation spec, data, evaluation code) is measured once and cached in
$POSTTRAIN_HOME/evals/; each model's result is an MLflow run in the experiment `posttrain/eval` with
its samples table. With two or more models, every model after the first is compared with the first
prompt by prompt (a paired interval of the change: Newcombe's for 0/1 scores, a bootstrap otherwise; McNemar's p for 0/1 scores):
accuracy, and each `--reward`'s mean. A reward's `model` parameter takes any MODEL form
(`--reward reward_model:model=rm_whole@latest,scope=full`).

Names follow lighteval / lm-evaluation-harness where they have one (`acc` is our `accuracy`, the
interval bounds are `_lo` / `_hi` beside the metric, `pass_at_k`, `maj_at_k`); those tools cannot load
their datasets offline here, which is why this command exists.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from pipeline.cli.args import add_model_arguments, model_fields_from
from pipeline.store.home import home
from stages.common import GenerationSpec, paired_keys
from toolkit.core.stats import INTERVALS

EXPERIMENT = "eval"  # posttrain/eval in MLflow


def parse_reward(text: str) -> dict:
    """`accuracy_math:after_think=true,timeout_s=2` -> a RewardSpec dict (values parsed as JSON when they are)."""
    name, _, rest = text.partition(":")
    params = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--reward {text}: parameters are key=value, comma-separated")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return {"name": name, "params": params}


def data_spec(text: str, n: int | None) -> dict:
    """`synthetic_math:eval`, `humaneval`, `path:FILE` -> a DataSpec dict (split defaults to eval)."""
    if text.startswith("path:"):
        return {"source": "file", "split": "all", "n": n, "params": {"path": text.removeprefix("path:")}}
    source, _, split = text.partition(":")
    return {"source": source, "split": split or "eval", "n": n}


def stage_output(ref: str) -> str | None:
    """The model directory of a stage output named `RUN/STAGE` or `STAGE@latest`; None if `ref` is
    not of those forms; LookupError when it is and names nothing."""
    from pipeline.store import runs

    if ref.endswith("@latest"):
        stage = ref.removesuffix("@latest")
        for record in reversed(runs.all_runs()):
            for s in record["stages"]:
                if s["name"] == stage and s["status"] == "completed" and s.get("output_dir"):
                    return str(Path(s["output_dir"]) / "model")
        raise LookupError(f"{ref}: no completed run has a stage {stage!r}")
    run, sep, stage = ref.partition("/")
    if not sep or "/" in stage or Path(ref).expanduser().exists() or ref.startswith(("models:", "runs:")):
        return None
    try:
        record = runs.find(run)
    except LookupError:
        return None  # an org/name hub id, say: not a run
    found = [s for s in record["stages"] if s["name"] == stage]
    if not found or not found[0].get("output_dir"):
        raise LookupError(f"{ref}: run {record['id']} has no finished stage {stage!r} "
                          f"(stages: {', '.join(s['name'] for s in record['stages'])})")
    return str(Path(found[0]["output_dir"]) / "model")


def resolve(ref: str) -> tuple[str, str]:
    """(model directory, content fingerprint) of any MODEL form."""
    from pipeline.models.named import check_model_ref, resolve_with_fingerprint
    from toolkit.core.files import dir_fingerprint

    if (path := stage_output(ref)) is not None:
        return path, dir_fingerprint(Path(path))
    if msg := check_model_ref(ref):
        raise LookupError(msg)
    return resolve_with_fingerprint(ref)


def with_model_resolved(reward):
    """A reward scored by a model (`reward_model:model=rm_whole@latest`) with that model given in any
    MODEL form, resolved to its directory; and that model's content fingerprint (None for a reward
    without a model), for the cache key: a directory retrained in place must not serve old scores."""
    ref = reward.params.get("model")
    if not isinstance(ref, str):
        return reward, None
    path, fingerprint = resolve(ref)
    return reward.model_copy(update={"params": {**reward.params, "model": path}}), fingerprint


def cache_path(fingerprint: str, spec, rows: list[dict], reward_models: list[str] = ()) -> Path:
    from toolkit.core.fingerprints import code_fingerprint

    material = {"model": fingerprint, "eval": spec.model_dump(mode="json"), "reward_models": list(reward_models),
                "rows": hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest(),
                "code": code_fingerprint(("stages.evaluate", "toolkit.rewards", "toolkit.rollouts"))}
    return home() / "evals" / (hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest() + ".json")


def log_to_mlflow(ref: str, spec, done, samples: list[dict]) -> str:
    import mlflow

    from pipeline.tracking import mlflow_runs

    c = mlflow_runs.client()
    run = c.create_run(mlflow_runs.experiment_id(EXPERIMENT), run_name=f"eval {ref}",
                       tags={"posttrain.eval.model": ref, "posttrain.eval.data": spec.data.source})
    run_id = run.info.run_id
    mlflow_runs.log_params(run_id, {"model": ref, **mlflow_runs.flatten(spec.model_dump(mode="json"), "eval.")})
    c.log_batch(run_id, metrics=[mlflow.entities.Metric(k, float(v), 0, 0) for k, v in done.metrics.items()])
    if samples:
        c.log_table(run_id, data={k: [str(r[k]) for r in samples] for k in samples[0]}, artifact_file="eval_samples.json")
    c.set_terminated(run_id)
    return run_id


def main_table(results: list[dict], paired: list[dict]) -> str:
    from pipeline.store.runs import grid, with_interval
    from stages.evaluate import SWEEP_PREFIXES

    keys = ["eval/accuracy", "eval/format_rate", "eval/completion_tokens_mean"]
    keys += sorted({k for r in results for k in r["metrics"] if k.startswith("eval/rewards/") and k.endswith("/mean")
                    and f"{k}_lo" in r["metrics"]})  # each --reward's mean, with its interval
    keys += sorted({k for r in results for k in r["metrics"] if k.startswith(SWEEP_PREFIXES) and k.endswith("accuracy")
                    or k.startswith(("eval/pass_at_", "eval/maj_at_")) and not k.endswith(("_lo", "_hi", "_n"))})
    rows = [["model", "n", *[k.removeprefix("eval/") for k in keys], "cached"]]
    rows += [[r["model"], f"{r['metrics'].get('eval/accuracy_n', 0):.0f}", *[with_interval(r["metrics"], k) for k in keys],
              "yes" if r["cached"] else "no"] for r in results]
    lines = [grid(rows)]
    for p in paired:
        for metric in ("accuracy", "pass_at_1", *sorted(k for k in p if k.startswith("rewards/"))):
            if (c := p.get(metric)) is None:
                continue
            test = f", McNemar p = {c['p']:.3g}" if "p" in c else " (paired bootstrap)"
            lines.append(f"{p['model']} against {p['against']}: {metric} {c['delta']:+.3f} [{c['lo']:+.3f}, "
                         f"{c['hi']:+.3f}] on {c['n']:.0f} prompts{test}"
                         + ("  (significant)" if c["significant"] else "  (not significant: the interval holds 0)"))
    lines.append(INTERVALS)
    return "\n".join(lines)


def cmd_eval(args) -> int:
    """Everything but the report goes to stderr (libraries such as DeepSpeed log to stdout on
    import), so `--json` output can be piped."""
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):
        outcome = evaluate_models(args)
    if isinstance(outcome, int):
        return outcome
    print(json.dumps(outcome, indent=1) if args.json else main_table(outcome["models"], outcome["paired"]))
    return 0


def evaluate_models(args) -> dict | int:
    from pydantic import ValidationError

    from data_curation.sources import load_rows
    from pipeline.gates import change_metrics
    from stages.evaluate import EvalSpec, evaluate_once
    from toolkit.core.files import write_json_atomic
    from toolkit.core.stats import significant

    try:
        spec = EvalSpec.model_validate({
            "data": data_spec(args.data, args.n), "max_new_tokens": args.max_new_tokens,
            "batch_size": args.batch_size, "samples": args.samples,
            "rewards": [parse_reward(r) for r in args.reward], "modes": args.mode, "budgets": args.budget,
            "template": args.template, "generation": model_fields_from(args, GenerationSpec)})
        if problems := spec.generation.problems():
            raise ValueError("; ".join(msg for _, msg in problems))
        resolved = [(ref, *resolve(ref)) for ref in args.models]
        rewards = [with_model_resolved(r) for r in spec.rewards]
        spec = spec.model_copy(update={"rewards": [r for r, _ in rewards]})
        reward_models = [f for _, f in rewards if f is not None]
        params = dict(spec.data.params)
        rows = load_rows(spec.data.source, spec.data.split, spec.data.n, spec.data.seed, params)
    except (ValidationError, ValueError, LookupError, KeyError, ImportError) as e:
        print(f"posttrain eval: {e}", file=sys.stderr)
        return 2
    results, scores = [], []
    for ref, model_dir, fingerprint in resolved:
        cache = cache_path(fingerprint, spec, rows, reward_models)
        cached = cache.exists()
        print(f"evaluating {ref} on {len(rows)} prompts of {args.data}" + (" (cached)" if cached else ""),
              file=sys.stderr, flush=True)
        done = evaluate_once(model_dir, spec, rows, args.trust_remote_code, cache)
        samples = [{"id": i, "score": s} for i, s in zip(done.scores["id"], done.scores["accuracy"])]
        run_id = log_to_mlflow(ref, spec, done, done.table or samples)
        results.append({"model": ref, "path": model_dir, "fingerprint": fingerprint, "cached": cached,
                        "mlflow_run_id": run_id, "metrics": done.metrics})
        scores.append(done.scores)
    paired = []
    for r, s in zip(results[1:], scores[1:]):
        m = change_metrics(s, scores[0])
        entry = {"model": r["model"], "against": results[0]["model"]}
        for metric in paired_keys(s):  # pass_at_1 when both sampled (--samples); each --reward's mean
            key = f"change/{metric}"
            if key not in m:
                continue
            c = {"delta": m[key], **{k: m[f"{key}_{k}"] for k in ("lo", "hi", "n", "p") if f"{key}_{k}" in m}}
            entry[metric.removeprefix("eval/")] = {**c, "significant": significant(c)}
        paired.append(entry)
    report = {"data": spec.data.model_dump(mode="json"), "n": len(rows), "models": results, "paired": paired}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "eval.json", report)
        for r, s in zip(results, scores):
            write_json_atomic(out / f"scores-{hashlib.sha256(r['model'].encode()).hexdigest()[:12]}.json", s)
    return report


def add_parser(sub) -> None:
    sp = sub.add_parser("eval", help="evaluate models on a data source, with intervals and paired comparisons")
    sp.add_argument("models", nargs="+", metavar="MODEL",
                    help="named model, directory, RUN/STAGE, STAGE@latest, models:/... or runs:/.../model")
    sp.add_argument("--data", required=True, help="SOURCE[:SPLIT] (split defaults to eval) or path:FILE")
    sp.add_argument("--n", type=int, default=None, help="prompts (default: the source's default)")
    sp.add_argument("--reward", action="append", default=[], metavar="NAME[:k=v,...]", help="also score this reward")
    sp.add_argument("--mode", action="append", default=[], choices=["think", "no_think"], help="accuracy per mode")
    sp.add_argument("--budget", action="append", default=[], type=int, help="thinking budget in tokens (repeatable)")
    sp.add_argument("--samples", type=int, default=0, help="sampled completions per prompt: pass@1, pass@k, maj@k")
    sp.add_argument("--max-new-tokens", type=int, default=256)
    sp.add_argument("--batch-size", type=int, default=16, help="prompts per generate call (bigger is faster on "
                    "CPU; greedy outputs can differ in a few prompts between batch sizes)")
    sp.add_argument("--template", default="chat", help="prompt template: chat, r1_zero or a {prompt} string")
    sp.add_argument("--trust-remote-code", action="store_true")
    add_model_arguments(sp, GenerationSpec, skip=set())  # --engine, --precision
    sp.add_argument("--json", action="store_true", help="print the report as JSON")
    sp.add_argument("--out", default=None, help="also write eval.json and per-prompt scores here")
    sp.set_defaults(fn=cmd_eval)
