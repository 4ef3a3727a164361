"""`posttrain models`, `posttrain generate` and `posttrain data`: look at the model and data zoo."""

from __future__ import annotations

import json
import sys


def cmd_models(args) -> int:
    from pipeline.models import NAMED_MODELS, model_status, models_dir

    print(f"named models (cached in {models_dir()}):")
    for name, m in NAMED_MODELS.items():
        print(f"  {name:24s} {model_status(name):10s} {m.description}\n  {'':24s} {'':10s} from: {m.source}")
    print("any local model directory or Hugging Face id in the local cache also works wherever a model is named")
    return 0


def cmd_generate(args) -> int:
    from pipeline.models import check_model_ref, resolve_model
    from stages.rollouts import SamplingSpec, generate, load_for_generation

    if msg := check_model_ref(args.model):
        print(msg, file=sys.stderr)
        return 2
    print(f"loading {args.model} (a named model is built once on first use)...", file=sys.stderr, flush=True)
    model, tokenizer = load_for_generation(resolve_model(args.model), args.trust_remote_code)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": args.prompt}]
    spec = SamplingSpec(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    print(generate(model, tokenizer, [messages], spec)[0][0])
    return 0


def cmd_data_show(args) -> int:
    from data_curation.sources import load_rows

    params = {}
    for item in args.param:  # values are JSON where they parse as JSON (lists, numbers), else strings
        key, _, value = item.partition("=")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    source = args.source
    if source.startswith("path:"):
        source, params["path"] = "file", source.removeprefix("path:")
    rows = load_rows(source, args.split, args.limit, args.seed, params)
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=1))
        return 0
    for r in rows:
        q = r["prompt"][-1]["content"].replace("\n", " ")
        print(f"{r['id']}  [{r['verifier']}, difficulty {r['difficulty']}, {r['language']}]\n"
              f"  Q: {q[:200]}\n  A: {str(r['answer'])[:120]}")
    print(f"{len(rows)} rows of {args.source} ({args.split})", file=sys.stderr)
    return 0


def cmd_data_list(args) -> int:
    from data_curation.sources import ORIGINS, RESERVED, source_params

    for name, origin in ORIGINS.items():
        params = sorted(source_params(name) - RESERVED)
        print(f"  {name:18s} {origin}\n  {'':18s} params: {', '.join(params) or '-'}")
    return 0


def add_parsers(sub) -> None:
    sp = sub.add_parser("models", help="named models and whether each is built")
    sp.set_defaults(fn=cmd_models)
    sp = sub.add_parser("generate", help="print a model's completion for one prompt")
    sp.add_argument("--model", required=True, help="named model, model directory (e.g. a stage's output/model) or hub id")
    sp.add_argument("--prompt", required=True)
    sp.add_argument("--system", default=None, help="system message (default: the chat template's)")
    sp.add_argument("--max-new-tokens", type=int, default=128)
    sp.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--trust-remote-code", action="store_true")
    sp.set_defaults(fn=cmd_generate)
    data = sub.add_parser("data", help="data sources").add_subparsers(dest="data_command", required=True)
    sp = data.add_parser("list", help="the named sources and where they come from")
    sp.set_defaults(fn=cmd_data_list)
    sp = data.add_parser("show", help="print a source's rows in the common schema")
    sp.add_argument("source", help="source name, or path:FILE for a local JSONL/Parquet/datasets dir")
    sp.add_argument("--split", choices=["train", "eval", "all"], default="all")
    sp.add_argument("--limit", type=int, default=10)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="source parameter")
    sp.add_argument("--json", action="store_true", help="a JSON list of rows")
    sp.set_defaults(fn=cmd_data_show)
