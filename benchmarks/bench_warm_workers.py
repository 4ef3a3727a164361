"""Warm workers against fresh worker interpreters: a recipe's wall time, measured in one run.

Each round runs `posttrain run RECIPE --profile tiny` twice from fresh homes, once with every stage's
worker a fresh `python -m pipeline.worker` (POSTTRAIN_WARM_WORKERS=0, the baseline) and once forked
from the flow's warm server (pipeline.launch.warm), taking turns which goes first, so that a machine
whose speed drifts does not favour one side. Printed: the median wall seconds of each side, the
median of the stages' summed seconds (`posttrain show`), and the ratios.

    .venv/bin/python benchmarks/bench_warm_workers.py [--recipe smoke] [--rounds 3] [--steps 3] [--ranks 2]

`--steps` caps every training stage (`stages.<name>.max_steps`), so start-up is what is measured;
evaluation is off (`eval=null`). `--ranks N` launches every one-process stage as N DeepSpeed ranks
(ZeRO-2): DeepSpeed's launcher against ranks forked from the warm server.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys

from recipe_runs import fresh_home, latest_stages, run_recipe


def stage_overrides(recipe: str, steps: int, ranks: int | None) -> list[str]:
    from pipeline.recipe import load_recipe

    stages = load_recipe(recipe, "tiny").recipe.stages
    sets = [f"stages.{s.name}.max_steps={steps}" for s in stages if "max_steps" in type(s).model_fields]
    if ranks:
        sets += [f"stages.{s.name}.launcher={{mode: deepspeed, ranks: {ranks}}}" for s in stages
                 if s.launcher.mode == "subprocess"]
    return [arg for s in sets for arg in ("--set", s)] + ["--set", "eval=null"]


def one_run(recipe: str, args: list[str], warm: bool) -> tuple[float, float]:
    home, env = fresh_home(f"bench-warm-{int(warm)}-")
    env["POSTTRAIN_WARM_WORKERS"] = "1" if warm else "0"
    try:
        _, wall = run_recipe(recipe, env, "--profile", "tiny", *args)
        stages = sum(s.get("duration_s", 0.0) for s in latest_stages(env))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return wall, stages


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="smoke")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=None)
    a = ap.parse_args()
    args = stage_overrides(a.recipe, a.steps, a.ranks)
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for r in range(a.rounds):
        for warm in ((False, True) if r % 2 == 0 else (True, False)):
            times[warm].append(one_run(a.recipe, args, warm))
            print(f"round {r + 1}, {'warm' if warm else 'fresh'}: {times[warm][-1][0]:.1f} s wall, "
                  f"{times[warm][-1][1]:.1f} s in stages", flush=True)
    med = {w: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for w, ts in times.items()}
    how = f", each stage {a.ranks} DeepSpeed ranks" if a.ranks else ""
    print(f"\n`posttrain run {a.recipe} --profile tiny`, stages capped at {a.steps} steps{how}, no evaluation; "
          f"medians of {a.rounds}:")
    print("| workers | wall s | stages' s | wall vs fresh | stages vs fresh |\n| --- | --- | --- | --- | --- |")
    for warm, name in ((False, "fresh interpreters (baseline)"), (True, "forked from the warm server")):
        print(f"| {name} | {med[warm][0]:.1f} | {med[warm][1]:.1f} | {med[warm][0] / med[False][0]:.2f} "
              f"| {med[warm][1] / med[False][1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
