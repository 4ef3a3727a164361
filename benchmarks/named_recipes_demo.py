"""The named recipes on `demo` (SmolLM2-135M-Instruct on this CPU): does each make the model better?

Each recipe runs from a fresh home (so its wall time includes converting SmolLM2 and building the
student). Printed per recipe, as markdown for benchmarks/RESULTS.md:
- one row per stage: kind, seconds, held-out accuracy on the recipe's evaluation set (200
  `synthetic_math` prompts on demo) with its 95% interval, and the paired change against the model
  the stage started from, with its interval (`posttrain show`'s numbers);
- the base model and the recipe's product models on the second held-out set, `math_reworded`
  (wordings no training data uses), through `posttrain eval`: paired against the base model.
- the claims read outside the stages' own evaluations (EXTRA_SETS): qwen3's general RL on ifeval
  prompts, and r1's all_rl against sft_all scored by the run's reward models.

    .venv/bin/python benchmarks/named_recipes_demo.py [r1 kimi_k15 qwen3] [--set KEY=VALUE ...] [--write]

`--set` is passed to every `posttrain run` (a variant of the demo, e.g. longer answers); a set
`eval.max_new_tokens` also sets the token limit of the reworded set's evaluation.

`--write` appends the tables to benchmarks/RESULTS.md with the command and date. Runs take tens of
minutes each on 2 cores; nothing else should share the machine while they run.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys

from recipe_runs import POSTTRAIN, ROOT, fresh_home, latest_stages, run_recipe, table_header, table_row

BASE = "smollm2-135m-instruct"


def products(recipe: str) -> list[str]:
    """What the recipe offers a user, as the flow files it: every stage with `register:`, and the
    final stage unless it opts out (`register: false`)."""
    from pipeline.recipe import load_recipe

    stages = load_recipe(recipe, "demo").recipe.stages
    return [s.name for i, s in enumerate(stages)
            if s.registry or (i == len(stages) - 1 and s.registry is not False)]


def interval(metrics: dict, key: str) -> str:
    if key not in metrics:
        return ""
    lo, hi = metrics.get(f"{key}_lo"), metrics.get(f"{key}_hi")
    bounds = f" [{lo:+.3f}, {hi:+.3f}]" if key.startswith("change/") and lo is not None else \
        f" [{lo:.3f}, {hi:.3f}]" if lo is not None else ""
    return f"{metrics[key]:+.3f}{bounds}" if key.startswith("change/") else f"{metrics[key]:.3f}{bounds}"


def stage_table(stages: list[dict]) -> str:
    """Greedy accuracy per stage; with `eval.samples` set, also the R1 paper's sampled pass@1 (k
    samples at temperature 0.6) and its paired change, where the input model was sampled too."""
    sampled = any("eval/pass_at_1" in (s.get("metrics") or {}) for s in stages)
    extra = ("sampled pass@1 [95%]", "change vs its input [95%]") if sampled else ()
    lines = [table_header("stage", "kind", "status", "seconds", "held-out accuracy [95%]", "change vs its input [95%]",
                          *extra)]
    for s in stages:
        m = s.get("metrics") or {}
        more = (interval(m, "eval/pass_at_1"), interval(m, "change/eval/pass_at_1")) if sampled else ()
        lines.append(table_row(s["name"], s["kind"], s["status"], f"{s.get('duration_s', 0):.0f}",
                               interval(m, "eval/accuracy"), interval(m, "change/eval/accuracy"), *more))
    return "\n".join(lines)


def mode_table(stages: list[dict]) -> str:
    """Qwen3's mode and budget claims, per stage evaluated with modes: accuracy per mode, the paired
    think - no_think change, /no_think compliance (the empty think block), accuracy per budget, and
    how often budget 0's answers think anyway (close a think block the template had closed)."""
    evaluated = [s for s in stages if "eval/mode/think/accuracy" in (s.get("metrics") or {})]
    if not evaluated:
        return ""
    budgets = sorted({k.split("/")[2] for s in evaluated for k in s["metrics"]
                      if k.startswith("eval/budget/") and k.endswith("/accuracy")},
                     key=lambda b: float("inf") if b == "unlimited" else int(b))
    lines = [table_header("stage", "think [95%]", "no_think [95%]", "think - no_think [95%]", "no_think compliance",
                          *[f"budget {b}" for b in budgets], "budget 0: thought anyway")]
    for s in evaluated:
        m = s["metrics"]
        gain = "eval/mode/think_minus_no_think/accuracy"
        lines.append(table_row(s["name"], interval(m, "eval/mode/think/accuracy"), interval(m, "eval/mode/no_think/accuracy"),
                               f"{m[gain]:+.3f} [{m[gain + '_lo']:+.3f}, {m[gain + '_hi']:+.3f}]" if gain in m else "",
                               f"{m.get('eval/mode/no_think/mode_compliance', float('nan')):.3f}",
                               *[interval(m, f"eval/budget/{b}/accuracy") for b in budgets],
                               f"{m.get('eval/budget/0/thought_anyway_share', float('nan')):.3f}"))
    steps = []
    for s in evaluated:
        m, names = s["metrics"], [f"eval/budget_step/{b}_minus_{a}/accuracy" for a, b in zip(budgets, budgets[1:])]
        if found := [f"{k.split('/')[2].replace('_minus_', ' - ')} {m[k]:+.3f} [{m[k + '_lo']:+.3f}, {m[k + '_hi']:+.3f}]"
                     for k in names if k in m]:
            steps.append(f"- {s['name']}: " + ", ".join(found))
    paired = "\n\nEach budget against the next smaller one, paired on the same prompts:\n" + "\n".join(steps) if steps else ""
    return "Modes and thinking budgets (same 200 prompts, greedy):\n\n" + "\n".join(lines) + paired + "\n\n"


def posttrain_eval(models: list[str], data: str, tokens: int, env: dict[str, str], rewards: tuple[str, ...] = ()) -> str:
    """`posttrain eval`'s table for `models` on 200 prompts of `data`, paired against the first,
    with `rewards` (`--reward` values) scored too."""
    proc = subprocess.run([POSTTRAIN, "eval", *models, "--data", data, "--n", "200", "--max-new-tokens", str(tokens),
                           "--batch-size", "64", *[a for r in rewards for a in ("--reward", r)]],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else f"(posttrain eval failed: {proc.stderr.strip()[-500:]})"


def completed(stages: list[dict]) -> set[str]:
    return {s["name"] for s in stages if s["status"] == "completed"}


def reworded_table(recipe: str, env: dict[str, str], stages: list[dict], tokens: int = 80) -> str:
    models = [BASE] + [f"{name}@latest" for name in products(recipe) if name in completed(stages)]
    return posttrain_eval(models, "math_reworded:eval", tokens, env)


# Claims read outside the stages' own evaluations, each (data, models, tokens, rewards):
# - qwen3's general RL must raise the instruction-following pass rate: its input (fusion) and output
#   on ifeval prompts;
# - r1's all_rl must keep reasoning accuracy while its reward models' scores rise: its input (sft_all)
#   and output on the held-out math prompts, each answer also scored by the run's two reward models,
#   as all_rl's rewards score them (the summary for helpfulness, the whole response for the other).
EXTRA_SETS = {
    "qwen3": [("ifeval_synthetic:eval", ["fusion", "general_rl"], 128, ())],
    "r1": [("synthetic_math:eval", ["sft_all", "all_rl"], 80, ("reward_model:model=rm_helpful@latest,scope=answer",
                                                              "reward_model:model=rm_whole@latest,scope=full"))],
}


def extra_tables(recipe: str, env: dict[str, str], stages: list[dict]) -> str:
    blocks = []
    for data, names, tokens, rewards in EXTRA_SETS.get(recipe, []):
        models = [f"{name}@latest" for name in names if name in completed(stages)]
        if len(models) == len(names):
            scored = f", scored by {', '.join(rewards)}" if rewards else ""
            blocks.append(f"`{data}` (200 prompts, {tokens} tokens{scored}), paired against {models[0]}:\n\n"
                          f"```\n{posttrain_eval(models, data, tokens, env, rewards)}\n```\n")
    return "\n".join(blocks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*", default=["r1", "kimi_k15", "qwen3"])
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to every `posttrain run` (repeatable)")
    parser.add_argument("--write", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    args = parser.parse_args()
    set_args = [arg for value in args.sets for arg in ("--set", value)]
    tokens = next((v.split("=", 1)[1].strip() for v in args.sets if v.startswith("eval.max_new_tokens=")), "80")
    if not tokens.isdigit():
        parser.error(f"--set eval.max_new_tokens={tokens}: a whole number of tokens")
    tokens = int(tokens)
    report = []
    for recipe in args.recipes:
        home, env = fresh_home(f"named-{recipe}-")
        code, seconds = run_recipe(recipe, env, "--profile", "demo", *set_args, check=False)
        stages = latest_stages(env)
        block = (f"### `{recipe}` on `demo`: {'finished' if code == 0 else f'exit {code}'} in "
                 f"{seconds / 60:.1f} min (fresh home {home})\n\n{stage_table(stages)}\n\n{mode_table(stages)}"
                 f"Second held-out set (`math_reworded`, 200 prompts), paired against the base model:\n\n"
                 f"```\n{reworded_table(recipe, env, stages, tokens)}\n```\n\n{extra_tables(recipe, env, stages)}")
        print(block, flush=True)
        report.append(block)
    if args.write:
        command = "`.venv/bin/python benchmarks/named_recipes_demo.py " + " ".join(
            args.recipes + [f"--set '{v}'" for v in args.sets]) + " --write`"
        with open(ROOT / "benchmarks" / "RESULTS.md", "a") as f:
            f.write(f"\n## The named recipes on `demo` ({datetime.date.today()})\n\nCommand: {command}\n\n"
                    + "\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
