"""Evidence that distillation raises a student's held-out accuracy: run
benchmarks/recipes/distill_accuracy.yaml on `demo` in a fresh home and print the student's held-out
accuracy before and after, the teacher's on the same set, the KL to the teacher before and after,
and how many teacher traces were kept.

Usage: .venv/bin/python benchmarks/distill_accuracy.py [--profile demo]
"""

import argparse
import sys

from recipe_runs import ROOT, fresh_home, latest_stages, run_recipe


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="demo")
    a = ap.parse_args()
    _, env = fresh_home("bench-distill-accuracy-")
    recipe = str(ROOT / "benchmarks" / "recipes" / "distill_accuracy.yaml")
    # The profile sets the evaluation (mixed difficulties); these sums are what the teacher learned.
    held_out = ["--set", "eval.data={source: synthetic_math, split: eval, n: 24, params: {difficulties: [1]}}",
                "--set", "eval.max_new_tokens=64"]
    _, wall = run_recipe(recipe, env, "--profile", a.profile, *held_out)
    m = latest_stages(env)[-1]["metrics"]
    print(f"profile {a.profile}, {wall:.0f} s in all; held-out accuracy on {m.get('eval/n', 24):.0f} sums:")
    print("| student before | student after | teacher | KL(teacher || student) before -> after | traces kept |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| {m['before/eval/accuracy']:.3f} | {m['eval/accuracy']:.3f} | {m['teacher/eval/accuracy']:.3f} | "
          f"{m['distill/kl_before']:.2f} -> {m['distill/kl_after']:.2f} | "
          f"{m['distill/traces_kept']:.0f} of {m['distill/teacher_traces']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
