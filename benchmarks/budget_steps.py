"""A finished stage's thinking budgets again, with each step up the budget paired on the same
prompts: its model, held-out rows and evaluation settings as the stage recorded them (spec.json),
without the mode passes. For a run made before evaluations logged the paired steps
(`eval/budget_step/16_minus_0/accuracy`), or to check a run's numbers.

    POSTTRAIN_HOME=<home> .venv/bin/python benchmarks/budget_steps.py <stage output dir>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recipe_runs import ROOT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage_dir", type=Path, help="a completed stage's output folder (spec.json and model/ inside)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from pipeline.store.home import configure_environment
    from stages.evaluate import EvalSpec, evaluate
    from stages.runtime import load_stage_rows

    spec_file = a.stage_dir / "spec.json"
    if not spec_file.is_file() or not (a.stage_dir / "model").is_dir():
        ap.error(f"{a.stage_dir}: not a completed stage's folder (needs spec.json and model/)")
    configure_environment()
    recorded = json.loads(spec_file.read_text())
    spec = EvalSpec(**{**recorded["eval"], "modes": []})
    if not spec.budgets:
        ap.error(f"{spec_file}: its evaluation has no thinking budgets")
    rows = load_stage_rows(recorded["inputs"]["eval_data"])  # as the stage's worker loaded them
    metrics = evaluate(str(a.stage_dir / "model"), spec, rows).metrics
    print(f"{a.stage_dir.name}: {len(rows)} held-out prompts, greedy, {spec.max_new_tokens} tokens, "
          f"answer limit {spec.answer_max_new_tokens}")
    for key, value in metrics.items():
        if key.startswith(("eval/budget/", "eval/budget_step/")) and key.endswith("/accuracy"):
            sign = "+" if key.startswith("eval/budget_step/") else ""  # a change, or a rate
            low, high = metrics[key + "_lo"], metrics[key + "_hi"]
            p_value = f"  McNemar p = {metrics[key + '_p']:.3g}" if key + "_p" in metrics else ""
            name = key.split("/")[2].replace("_minus_", " - ")
            print(f"{name:>16}  {value:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]{p_value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
