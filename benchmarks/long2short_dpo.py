"""Evidence for long2short DPO on a real small model: run benchmarks/recipes/long2short_dpo.yaml on
`demo` in a fresh home and print, on the same held-out sums, the verbose model's and the DPO model's
accuracy and mean completion length, with the DPO stage's own reward accuracy and margin.

Usage: .venv/bin/python benchmarks/long2short_dpo.py [--profile demo] [--tolerance 0.10]
"""

import argparse
import json
import sys
from pathlib import Path

from recipe_runs import ROOT, fresh_home, latest_stages, run_recipe, table_header, table_row

sys.path.insert(0, str(ROOT))


def write_verbose_rows(path: Path, n: int = 1024) -> Path:
    """Two-digit sums whose thinking re-checks itself twice: the padded side of `padded_pairs`."""
    from data_curation.sources import load_rows
    from stages.preference_pairs import padded_pairs

    rows = {r["id"]: r for r in load_rows("synthetic_math", "train", n, 0, {"difficulties": [1]})}
    with path.open("w") as f:
        for pair in padded_pairs(list(rows.values()), padding=2):
            row = rows[pair["id"].split("#")[0]]
            f.write(json.dumps({"prompt": row["prompt"], "answer": row["answer"], "verifier": row["verifier"],
                                "solution": pair["rejected"]}) + "\n")
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--tolerance", type=float, default=0.10, help="largest accuracy drop that counts as holding")
    a = ap.parse_args()
    home, env = fresh_home("bench-long2short-")
    data = write_verbose_rows(home / "verbose_sums.jsonl")
    recipe = str(ROOT / "benchmarks" / "recipes" / "long2short_dpo.yaml")
    overrides = ["--set", f"stages.verbose_sft.data={{path: {data}}}",
                 "--set", "eval={data: {source: synthetic_math, split: eval, n: 24, params: {difficulties: [1]}}, "
                          "max_new_tokens: 160}"]
    _, wall = run_recipe(recipe, env, "--profile", a.profile, *overrides)
    stages = {s["name"]: s["metrics"] for s in latest_stages(env)}
    verbose, short = stages["verbose_sft"], stages["short_dpo"]
    change = short["eval/accuracy"] - verbose["eval/accuracy"]
    print(f"profile {a.profile}, {wall:.0f} s in all; held-out: {verbose['eval/n']:.0f} sums")
    print(table_header("model", "accuracy", "completion tokens (mean)", "thinking tokens (mean)"))
    for name, m in (("verbose (SFT on padded thinking)", verbose), ("after long2short DPO", short)):
        print(table_row(name, f"{m['eval/accuracy']:.3f}", f"{m['eval/completion_tokens_mean']:.1f}",
                        f"{m['eval/thinking_tokens_mean']:.1f}"))
    ratio = short["eval/completion_tokens_mean"] / max(verbose["eval/completion_tokens_mean"], 1e-9)
    print(f"length x{ratio:.2f}; accuracy change {change:+.3f} (tolerance {a.tolerance:.2f}: "
          f"{'holds' if -change <= a.tolerance else 'does not hold'}); DPO reward accuracy "
          f"{short.get('dpo/reward_accuracies', float('nan')):.2f}, margin {short.get('dpo/reward_margins', float('nan')):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
