"""What the evidence scripts share: run a recipe with `posttrain run` in a fresh POSTTRAIN_HOME (no
Prefect or MLflow settings of the caller leak in) and read its stages back from `posttrain show`."""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POSTTRAIN = str(Path(sys.executable).parent / "posttrain")


def fresh_home(prefix: str) -> tuple[Path, dict[str, str]]:
    home = Path(tempfile.mkdtemp(prefix=prefix))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    return home, {**env, "POSTTRAIN_HOME": str(home)}


def run_recipe(recipe: str, env: dict[str, str], *args: str, check: bool = True,
               deadline: float | None = None) -> tuple[int, float]:
    """`posttrain run RECIPE ARGS...`: its exit code and wall seconds. At `deadline` (a
    `time.perf_counter()` value) the run is stopped with Ctrl-C, as a person would stop it: the running
    stage is marked interrupted and the stages that finished keep their metrics (killed if it has not
    exited 60 s later)."""
    started = time.perf_counter()
    cmd = [POSTTRAIN, "run", recipe, *args]
    run = subprocess.Popen(cmd, cwd=ROOT, env=env)
    try:
        code = run.wait(timeout=None if deadline is None else max(0.0, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        print(f"deadline reached: stopping `posttrain run {recipe}` (Ctrl-C)", flush=True)
        run.send_signal(signal.SIGINT)
        try:
            code = run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            code = run.wait()
    if check and code:
        raise subprocess.CalledProcessError(code, cmd)
    return code, time.perf_counter() - started


def shown_run(env: dict[str, str] | None = None, run: str = "latest") -> dict | None:
    """A run's record (id, mlflow_run_id, stages, ...) as `posttrain show RUN --json` gives it."""
    show = subprocess.run([POSTTRAIN, "show", run, "--json"], cwd=ROOT, env=env, capture_output=True, text=True)
    return json.loads(show.stdout) if show.returncode == 0 else None


def latest_stages(env: dict[str, str]) -> list[dict]:
    """The latest run's stages (name, status, metrics, ...)."""
    return (shown_run(env) or {}).get("stages", [])


def table_header(*columns: str) -> str:
    """The first two lines of a markdown table (RESULTS.md takes the printed tables as they are)."""
    return f"| {' | '.join(columns)} |\n|{' --- |' * len(columns)}"


def table_row(*cells) -> str:
    return f"| {' | '.join(str(c) for c in cells)} |"


def positive_int(text: str) -> int:
    """An argparse type: a count that must be at least 1 (0 or less would run an empty benchmark)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number above 0, not {text}")
    return int(text)


def non_negative_int(text: str) -> int:
    """An argparse type: 0 or more (a thinking budget of 0 is a real setting)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, not {text}")
    return int(text)


def budget_benchmark_parser(doc: str, budget: type = positive_int) -> argparse.ArgumentParser:
    """The arguments every thinking-budget benchmark takes: a model that thinks, how many held-out
    prompts, the budgets, the answer limit and the batch (qwen3's demo evaluation by default)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=positive_int, default=200)
    ap.add_argument("--budgets", type=budget, nargs="+", default=[16, 64])
    ap.add_argument("--answer", type=positive_int, default=32, help="answer_max_new_tokens, as qwen3's evaluation")
    ap.add_argument("--batch-size", type=positive_int, default=64)
    return ap


def same_completions(first: list, second: list) -> int:
    """How many completions (toolkit.rollouts.Completion) two ways made alike: text, token count,
    thinking tokens and budget flag."""
    key = lambda c: (c.text, c.tokens, c.thinking_tokens, c.budget_hit)
    return sum(key(a) == key(b) for a, b in zip(first, second))


def stage_arms_in_turn(arms: dict[str, dict[str, float]], rounds: int, train, row) -> dict[str, float]:
    """Each arm of a training-path benchmark in turn, `rounds` times: `train(arm)` runs the stage and
    returns its metrics, which must report the arm's flags (e.g. train/padding_free: 1.0), else the
    benchmark stops (the stage chose another path than the arm measures); `row(round, arm, metrics)`
    gives the printed table row's cells. Returns each arm's training seconds in sum."""
    seconds = dict.fromkeys(arms, 0.0)
    for r in range(rounds):
        for arm, expected in arms.items():
            m = train(arm)
            if (found := {k: m[k] for k in expected}) != expected:
                raise SystemExit(f"{arm}: the stage chose another path ({found}); see its log above")
            seconds[arm] += m["train/runtime_s"]
            print(table_row(*row(r + 1, arm, m)), flush=True)
    return seconds
