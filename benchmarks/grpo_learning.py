"""Evidence that the grpo stage learns: run benchmarks/recipes/grpo_learning.yaml (SFT warm-up of
the tiny model, then GRPO with the accuracy reward, fixed seeds) in a fresh home and print the
training accuracy curve: the mean over each tenth of the run, and first fifth vs last fifth.

Usage: .venv/bin/python benchmarks/grpo_learning.py
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="bench-grpo-learning-"))
    env = {**os.environ, "POSTTRAIN_HOME": str(home)}
    for var in ("MLFLOW_TRACKING_URI", "PREFECT_HOME"):
        env.pop(var, None)
    recipe = ROOT / "benchmarks" / "recipes" / "grpo_learning.yaml"
    subprocess.run([str(Path(sys.executable).parent / "posttrain"), "run", str(recipe)], cwd=ROOT, env=env,
                   check=True, capture_output=True)
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("posttrain/grpo_learning")
    warm, rl = (client.search_runs(exp.experiment_id, f"tags.`posttrain.stage` = '{s}'")[0] for s in ("warmup", "rl"))
    acc = [m.value for m in sorted(client.get_metric_history(rl.info.run_id, "accuracy"), key=lambda m: m.step)]
    k = max(1, len(acc) // 5)
    first, last = sum(acc[:k]) / k, sum(acc[-k:]) / k
    tenth = max(1, len(acc) // 10)
    curve = [sum(acc[i:i + tenth]) / len(acc[i:i + tenth]) for i in range(0, len(acc), tenth)]
    print(f"steps: {len(acc)}; training accuracy (sampled at temperature 1) per tenth of the run:")
    print("  " + "  ".join(f"{v:.3f}" for v in curve))
    print(f"first fifth {first:.3f}  last fifth {last:.3f}  ratio {last / max(first, 1e-9):.2f}x")
    print(f"held-out greedy accuracy: after SFT warm-up {warm.data.metrics['eval/accuracy']:.3f}, "
          f"after GRPO {rl.data.metrics['eval/accuracy']:.3f}")
    return 0 if last > first else 1


if __name__ == "__main__":
    sys.exit(main())
