"""`posttrain models`, `posttrain generate` and `posttrain data`: look at the model and data zoo."""

from __future__ import annotations

import json
import sys

from pipeline.cli.args import add_model_arguments, model_fields_from
from stages.common import GenerationSpec


def cmd_models(args) -> int:
    from pipeline.models.named import NAMED_MODELS, model_status, models_dir

    print(f"named models (cached in {models_dir()}):")
    for name, m in NAMED_MODELS.items():
        print(f"  {name:24s} {model_status(name):10s} {m.description}\n  {'':24s} {'':10s} from: {m.source}")
    print("any local model directory or Hugging Face id in the local cache also works wherever a model is named")
    return 0


def cmd_generate(args) -> int:
    from pipeline.models.named import check_model_ref, resolve_model
    from toolkit.rollouts import SamplingSpec

    if msg := check_model_ref(args.model):
        print(msg, file=sys.stderr)
        return 2
    if args.thinking_budget is not None and args.thinking_budget < 0:
        print("--thinking-budget must be 0 or more tokens (0 = --no-think)", file=sys.stderr)
        return 2
    generation = GenerationSpec(**model_fields_from(args, GenerationSpec))
    if problems := generation.problems():
        print(f"posttrain generate: {'; '.join(msg for _, msg in problems)}", file=sys.stderr)
        return 2
    print(f"loading {args.model} (a named model is built once on first use)...", file=sys.stderr, flush=True)
    engine = generation.open(resolve_model(args.model), args.trust_remote_code)
    tokenizer = engine.tokenizer
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": args.prompt}]
    spec = SamplingSpec(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                        enable_thinking=not args.no_think, thinking_budget=args.thinking_budget,
                        answer_max_new_tokens=args.answer_max_new_tokens,
                        **({"stop_thinking": args.stop_thinking} if args.stop_thinking is not None else {}))
    done = engine.complete([messages], spec)[0][0]
    if not args.json:
        print(done.text)
        return 0
    thinking, answer = thinking_and_answer(done.text, spec.effective().enable_thinking)
    if done.budget_hit:  # the model's own thinking, without the inserted instruction
        thinking = thinking.removesuffix(spec.stop_thinking.split("</think>")[0].strip()).rstrip()
    thinking_tokens = done.thinking_tokens
    if thinking_tokens is None:
        thinking_tokens = len(tokenizer(thinking, add_special_tokens=False)["input_ids"]) if thinking else 0
    print(json.dumps({"thinking": thinking, "answer": answer, "thinking_tokens": thinking_tokens,
                      "truncated": done.budget_hit, "text": done.text, "finished": done.finished}, ensure_ascii=False))
    return 0


def thinking_and_answer(text: str, thinking_mode: bool) -> tuple[str, str]:
    """(thinking, answer) of a generated text; in no-think mode the prompt held the empty block, and
    in thinking mode a block that never closed is all thinking."""
    if not thinking_mode:
        return "", text
    head, closed, tail = text.partition("</think>")
    return (head.strip().removeprefix("<think>").strip(), tail.strip()) if closed else (text, "")


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
    add_model_arguments(sp, GenerationSpec, skip=set())  # --engine, --precision
    sp.add_argument("--no-think", action="store_true", help="no-think mode: the empty think block ends the prompt")
    sp.add_argument("--thinking-budget", type=int, default=None, metavar="N",
                    help="stop the thinking after N tokens, insert the stop-thinking string, then answer (0 = --no-think)")
    sp.add_argument("--answer-max-new-tokens", type=int, default=None,
                    help="with a budget: tokens for the answer after the thinking (default: --max-new-tokens)")
    sp.add_argument("--stop-thinking", default=None, help="the string a budget inserts (default: Qwen's)")
    sp.add_argument("--json", action="store_true",
                    help='print {"thinking", "answer", "thinking_tokens", "truncated", "text", "finished"}')
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
