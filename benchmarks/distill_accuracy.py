"""Evidence that distillation raises a student's held-out accuracy: run
benchmarks/recipes/distill_accuracy.yaml on `demo` in a fresh home and print the student's held-out
accuracy before and after, the teacher's on the same set, the KL to the teacher before and after,
and how many teacher traces were kept.

Usage: .venv/bin/python benchmarks/distill_accuracy.py [--profile demo]
       .venv/bin/python benchmarks/distill_accuracy.py --reevaluate HOME [--n 96]
         (the three models of HOME's latest run, on N held-out sums instead of the run's 24)
"""

import argparse
import os
import sys
from pathlib import Path

from recipe_runs import ROOT, fresh_home, latest_stages, run_recipe, table_header, table_row

HELD_OUT = {"source": "synthetic_math", "split": "eval", "params": {"difficulties": [1]}}


def reevaluate(home: Path, n: int) -> None:
    """Student before (the profile's student), student after and teacher, on `n` held-out sums."""
    os.environ["POSTTRAIN_HOME"] = str(home)
    sys.path.insert(0, str(ROOT))
    from data_curation.sources import load_rows
    from stages.evaluate import EvalSpec, evaluate

    stages = {s["name"]: s for s in latest_stages({**os.environ})}
    if not {"distill_off", "teacher_sft"} <= set(stages):
        sys.exit(f"{home}: its latest run is not a distill_accuracy run (no distill_off and teacher_sft stages)")
    spec = EvalSpec(data={**HELD_OUT, "n": n}, max_new_tokens=64)
    rows = load_rows("synthetic_math", "eval", n, 0, HELD_OUT["params"])
    models = {"student before": str(home / "models" / "smollm2-135m-student"),
              "student after": str(Path(stages["distill_off"]["output_dir"]) / "model"),
              "teacher": str(Path(stages["teacher_sft"]["output_dir"]) / "model")}
    print(f"held-out: {len(rows)} difficulty-1 sums, greedy, 64 new tokens")
    print(table_header("model", "accuracy", "correct", "format rate"))
    for name, model in models.items():
        m = evaluate(model, spec, rows).metrics
        print(table_row(name, f"{m['eval/accuracy']:.3f}", f"{round(m['eval/accuracy'] * len(rows))} of {len(rows)}",
                        f"{m['eval/format_rate']:.2f}"), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--reevaluate", type=Path, default=None, help="a finished run's POSTTRAIN_HOME")
    ap.add_argument("--n", type=int, default=96, help="with --reevaluate: held-out sums")
    a = ap.parse_args()
    if a.reevaluate:
        reevaluate(a.reevaluate, a.n)
        return 0
    _, env = fresh_home("bench-distill-accuracy-")
    recipe = str(ROOT / "benchmarks" / "recipes" / "distill_accuracy.yaml")
    # The profile sets the evaluation (mixed difficulties); these sums are what the teacher learned.
    held_out = ["--set", "eval.data={source: synthetic_math, split: eval, n: 24, params: {difficulties: [1]}}",
                "--set", "eval.max_new_tokens=64"]
    _, wall = run_recipe(recipe, env, "--profile", a.profile, *held_out)
    m = latest_stages(env)[-1]["metrics"]
    print(f"profile {a.profile}, {wall:.0f} s in all; held-out accuracy on {m.get('eval/n', 24):.0f} sums:")
    print(table_header("student before", "student after", "teacher", "KL(teacher || student) before -> after",
                       "traces kept"))
    print(table_row(f"{m['before/eval/accuracy']:.3f}", f"{m['eval/accuracy']:.3f}", f"{m['teacher/eval/accuracy']:.3f}",
                    f"{m['distill/kl_before']:.2f} -> {m['distill/kl_after']:.2f}",
                    f"{m['distill/traces_kept']:.0f} of {m['distill/teacher_traces']:.0f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
