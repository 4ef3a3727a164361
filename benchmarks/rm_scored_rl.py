"""Evidence that model-scored GRPO optimises its reward model: run benchmarks/recipes/rm_scored_rl.yaml
in a fresh home and print the reward model's mean score of the policy's samples per tenth of the
run, first fifth against last fifth, and the scoring throughput (completions per second).

Usage: .venv/bin/python benchmarks/rm_scored_rl.py
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SCORE = "rewards/reward_model_full/mean"


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="bench-rm-scored-rl-"))
    env = {**os.environ, "POSTTRAIN_HOME": str(home)}
    for var in ("MLFLOW_TRACKING_URI", "PREFECT_HOME"):
        env.pop(var, None)
    recipe = ROOT / "benchmarks" / "recipes" / "rm_scored_rl.yaml"
    subprocess.run([str(Path(sys.executable).parent / "posttrain"), "run", str(recipe)], cwd=ROOT, env=env,
                   check=True, capture_output=True)
    import mlflow

    from stages.rl_curves import fifths

    client = mlflow.MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("posttrain/rm_scored_rl")
    rm, rl = (client.search_runs(exp.experiment_id, f"tags.`posttrain.stage` = '{s}'")[0] for s in ("rm", "rl"))
    score = [m.value for m in sorted(client.get_metric_history(rl.info.run_id, SCORE), key=lambda m: m.step)]
    first, last = fifths(score)
    tenth = max(1, len(score) // 10)
    curve = [sum(score[i:i + tenth]) / len(score[i:i + tenth]) for i in range(0, len(score), tenth)]
    m = rl.data.metrics
    print(f"reward model: held-out pairwise accuracy {rm.data.metrics['rm/pairwise_accuracy']:.2f}")
    print(f"steps: {len(score)}; the reward model's mean score of the policy's samples per tenth of the run:")
    print("  " + "  ".join(f"{v:+.3f}" for v in curve))
    print(f"first fifth {first:+.3f}  last fifth {last:+.3f}  change {last - first:+.3f}")
    scored, ms = m.get("train/rewards/reward_model_full/scored"), m.get("train/rewards/reward_model_full/score_ms")
    if scored and ms:
        print(f"scoring throughput: {scored:.0f} completions in {ms / 1000:.2f} s ({scored / ms * 1000:.0f}/s)")
    return 0 if last > first else 1


if __name__ == "__main__":
    sys.exit(main())
