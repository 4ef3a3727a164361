"""Evidence that distillation raises a student's held-out accuracy: run
benchmarks/recipes/distill_accuracy.yaml on `demo` in a fresh home and print the student's held-out
accuracy before and after, the teacher's on the same set, the KL to the teacher before and after,
and how many teacher traces were kept.

Usage: .venv/bin/python benchmarks/distill_accuracy.py [--profile demo]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POSTTRAIN = str(Path(sys.executable).parent / "posttrain")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="demo")
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-distill-accuracy-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["POSTTRAIN_HOME"] = str(home)
    recipe = str(ROOT / "benchmarks" / "recipes" / "distill_accuracy.yaml")
    started = time.perf_counter()
    # The profile sets the evaluation (mixed difficulties); these sums are what the teacher learned.
    held_out = ["--set", "eval.data={source: synthetic_math, split: eval, n: 24, params: {difficulties: [1]}}",
                "--set", "eval.max_new_tokens=64"]
    subprocess.run([POSTTRAIN, "run", recipe, "--profile", a.profile, *held_out], cwd=ROOT, env=env, check=True)
    wall = time.perf_counter() - started
    show = subprocess.run([POSTTRAIN, "show", "latest", "--json"], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True)
    stage = json.loads(show.stdout)["stages"][-1]
    m = stage["metrics"]
    print(f"profile {a.profile}, {wall:.0f} s in all; held-out accuracy on {m.get('eval/n', 24):.0f} sums:")
    print("| student before | student after | teacher | KL(teacher || student) before -> after | traces kept |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| {m['before/eval/accuracy']:.3f} | {m['eval/accuracy']:.3f} | {m['teacher/eval/accuracy']:.3f} | "
          f"{m['distill/kl_before']:.2f} -> {m['distill/kl_after']:.2f} | "
          f"{m['distill/traces_kept']:.0f} of {m['distill/teacher_traces']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
