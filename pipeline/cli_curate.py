"""`posttrain curate STEP --train FILE_OR_SOURCE ... --out DIR`: one curation step outside a recipe,
with the same code as the stage kinds; writes kept.jsonl, removed.jsonl and report.json into DIR."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
    from data_curation.sources import load_rows
    from data_curation.stage_kinds import CURATION_CONFIGS, curate
    from pipeline.models import check_model_ref, resolve_model
    from stages.common import DataSpec

    kind = STEPS[args.step]
    fields = {"name": "cli", "data": _spec(args.train), **{k: v for k, v in vars(args).items()
                                                         if k in CURATION_CONFIGS[kind].model_fields and v is not None
                                                         and k not in ("data", "name")}}
    if kind == "decontaminate":
        fields["eval_sets"] = [_spec(e) for e in args.eval or []]
    cfg = CURATION_CONFIGS[kind].model_validate(fields)
    from data_curation.sources import check_data_spec

    problems = [f"--train: {msg}" for _, msg in check_data_spec(cfg.data.source, cfg.data.params)]
    problems += [f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in cfg.semantic_errors()]
    if getattr(cfg, "model", None) and (msg := check_model_ref(cfg.model)):
        problems.append(f"--model: {msg}")
    if problems:
        print("refused:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    load = lambda s: load_rows(s.source, s.split, s.n, s.seed, s.params)
    data: DataSpec = cfg.data
    eval_rows = [r for s in cfg.eval_sets for r in load(s)] if kind == "decontaminate" else None
    model_dir = resolve_model(cfg.model) if getattr(cfg, "model", None) else None
    report = curate(cfg, load(data), Path(args.out), model_dir, eval_rows)
    print(json.dumps(report, indent=1))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("curate", help="run one curation step on a file or source, outside a recipe")
    steps = p.add_subparsers(dest="step", required=True)
    for step, kind in STEPS.items():
        sp = steps.add_parser(step, help=f"the {kind} stage kind, standalone")
        sp.add_argument("--train", required=True, help="JSONL/Parquet/datasets dir, or a source name[:split]")
        sp.add_argument("--out", required=True, help="directory for kept.jsonl, removed.jsonl, report.json")
        if kind == "decontaminate":
            sp.add_argument("--eval", action="append", required=True, help="eval set (repeatable): source[:split] or file")
            sp.add_argument("--ngram", type=int)
            sp.add_argument("--mode", choices=["any", "coverage"])
            sp.add_argument("--threshold", type=float)
        if kind == "dedup":
            sp.add_argument("--threshold", type=float)
            sp.add_argument("--exact-only", dest="near", action="store_false", default=None)
        if kind in ("difficulty_filter", "no_cot_filter"):
            sp.add_argument("--model", required=True, help="named model, model directory or hub id")
            sp.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
            sp.add_argument("--temperature", type=float)
            sp.add_argument("--rollout", choices=["hf", "vllm"])
        if kind == "difficulty_filter":
            sp.add_argument("--samples", type=int)
            sp.add_argument("--low", type=float)
            sp.add_argument("--high", type=float)
        if kind == "no_cot_filter":
            sp.add_argument("--tries", type=int)
        sp.set_defaults(fn=cmd_curate)
