"""`posttrain curate STEP --train FILE_OR_SOURCE ... --out DIR`: one curation step outside a recipe,
with the same code as the stage kinds; writes kept.jsonl, removed.jsonl and report.json into DIR."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from data_curation.sources import check_data_spec, load_rows
from pipeline.cli.args import add_model_arguments, model_fields_from
from pipeline.models.named import check_model_ref, resolve_model
from stages.common import GenerationSpec
from stages.curation import CURATION_CONFIGS, curate

STEPS = {"decontaminate": "decontaminate", "dedup": "dedup", "difficulty-filter": "difficulty_filter",
         "no-cot-filter": "no_cot_filter", "trace-filter": "trace_filter"}


def _spec(ref: str) -> dict:
    """A CLI data reference: a file path, `path:FILE`, or a source name with an optional `:split`."""
    ref = ref.removeprefix("path:")
    if Path(ref).exists():
        return {"path": ref, "split": "all"}
    source, _, split = ref.partition(":")
    return {"source": source, "split": split or "all"}


def cmd_curate(args) -> int:
    kind = STEPS[args.step]
    model = CURATION_CONFIGS[kind]
    fields = {**model_fields_from(args, model), "name": "cli", "data": _spec(args.train)}
    if "model" in model.model_fields:  # a sampling filter: --engine, --precision
        fields["generation"] = model_fields_from(args, GenerationSpec)
    if kind == "decontaminate":
        fields["eval_sets"] = [_spec(e) for e in args.eval or []]
    cfg = model.model_validate(fields)
    problems = [f"--train: {msg}" for _, msg in check_data_spec(cfg.data.source, cfg.data.params)]
    problems += [f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in cfg.semantic_errors()]
    if getattr(cfg, "model", None) and (msg := check_model_ref(cfg.model)):
        problems.append(f"--model: {msg}")
    if problems:
        print("refused:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    load = lambda s: load_rows(s.source, s.split, s.n, s.seed, s.params)
    eval_rows = [r for s in cfg.eval_sets for r in load(s)] if kind == "decontaminate" else None
    model_dir = resolve_model(cfg.model) if getattr(cfg, "model", None) else None
    report = curate(cfg, load(cfg.data), Path(args.out), model_dir, eval_rows)
    print(json.dumps(report, indent=1))
    return 0


PIPELINE_ONLY = {"name", "kind", "evaluate", "gate", "registry"}  # stage fields that mean nothing standalone


def add_parser(sub) -> None:
    p = sub.add_parser("curate", help="run one curation step on a file or source, outside a recipe")
    steps = p.add_subparsers(dest="step", required=True)
    for step, kind in STEPS.items():
        sp = steps.add_parser(step, help=f"the {kind} stage kind, standalone; flags are its config's fields")
        sp.add_argument("--train", required=True, help="JSONL/Parquet/datasets dir, or a source name[:split]")
        sp.add_argument("--out", required=True, help="directory for kept.jsonl, removed.jsonl, report.json")
        if kind == "decontaminate":
            sp.add_argument("--eval", action="append", required=True, help="eval set (repeatable): source[:split] or file")
        add_model_arguments(sp, CURATION_CONFIGS[kind], skip=PIPELINE_ONLY)
        if "model" in CURATION_CONFIGS[kind].model_fields:
            add_model_arguments(sp, GenerationSpec, skip=set())
        sp.set_defaults(fn=cmd_curate)
