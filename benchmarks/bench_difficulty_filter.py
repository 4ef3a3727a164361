"""Difficulty filtering throughput: prompts per second and the share of the time spent generating
(the rest is scoring with the verifiers), through the same code as the `difficulty_filter` stage.

Usage: .venv/bin/python benchmarks/bench_difficulty_filter.py --model tiny-qwen3 --prompts 64 --samples 8
       [--engines hf:float32 ct2:float32 ct2:int8]
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--template", default="chat", help="chat, chat_boxed, r1_zero, ...")
    ap.add_argument("--engines", nargs="+", default=["hf:float32", "ct2:float32", "ct2:int8"],
                    help="engine:precision pairs, measured in this order; ratios are to the first")
    a = ap.parse_args()

    from data_curation.report import EverythingRemoved
    from data_curation.sources import load_rows
    from pipeline.models.named import resolve_model
    from pipeline.store.home import configure_environment
    from stages.curation import DifficultyFilterConfig, curate

    configure_environment()
    model_dir = resolve_model(a.model)
    rows = load_rows("synthetic_math", "train", a.prompts, seed=11, params={"difficulties": [1, 2]})
    print(f"model {a.model}: {a.prompts} prompts x {a.samples} samples, up to {a.max_new_tokens} new tokens, "
          f"template {a.template}")
    rates = {}
    for engine, precision in [e.split(":") for e in a.engines]:
        cfg = DifficultyFilterConfig(name="bench", data="synthetic_math", model=a.model, samples=a.samples,
                                     max_new_tokens=a.max_new_tokens, template=a.template,
                                     generation={"engine": engine, "precision": precision})
        out = Path(tempfile.mkdtemp(prefix="bench-difficulty-"))
        try:
            curate(cfg, rows, out, model_dir)
        except EverythingRemoved as e:  # still measured: report.json is written before the check
            print(f"note: {e}")
        r = json.loads((out / "report.json").read_text())
        rates[(engine, precision)] = r["prompts_per_s"]
        print(f"{engine} {precision}: {r['prompts_per_s']:.2f} prompts/s, {r['prompts_per_s'] * a.samples:.1f} samples/s; "
              f"generation {100 * r['generation_share']:.0f}% of {r['seconds']:.1f} s, scoring the rest; "
              f"kept {r['rows_out']} of {r['rows_in']} ({r['removed']})")
    base = rates[next(iter(rates))]
    print("ratio to the first: " + ", ".join(f"{e} {p} {v / base:.2f}x" for (e, p), v in rates.items()))
