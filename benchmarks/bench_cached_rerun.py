"""How long a fully cached rerun of `smoke` on `tiny` takes, against `posttrain validate` of the same
recipe (the floor: reading and checking the recipe), without a Prefect server (a temporary API
starts and stops with the run) and with one running (`posttrain ui`).

    .venv/bin/python benchmarks/bench_cached_rerun.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.launch.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
POSTTRAIN = str(Path(sys.executable).parent / "posttrain")


def timed(args: list[str], env: dict) -> float:
    started = time.perf_counter()
    subprocess.run([POSTTRAIN, *args], cwd=ROOT, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-cached-rerun-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["POSTTRAIN_HOME"] = str(home)
    recipe = ["smoke", "--profile", "tiny"]
    first = timed(["run", *recipe], env)
    rows = {"posttrain validate (floor)": [timed(["validate", *recipe], env) for _ in range(a.repeats)],
            "cached rerun, temporary API": [timed(["run", *recipe], env) for _ in range(a.repeats)]}
    ui = subprocess.Popen([POSTTRAIN, "ui", "--prefect-port", str(free_port()), "--mlflow-port", str(free_port())],
                          cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        record = home / "prefect" / "server.json"
        deadline = time.time() + 120
        import httpx

        while time.time() < deadline:
            try:
                if httpx.get(json.loads(record.read_text())["api_url"] + "/health", timeout=1).status_code == 200:
                    break
            except (OSError, ValueError, httpx.HTTPError):
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError("posttrain ui did not come up")
        time.sleep(20)  # let the UI's servers finish starting (MLflow's uvicorn workers) before timing
        rows["cached rerun, posttrain ui running"] = [timed(["run", *recipe], env) for _ in range(a.repeats)]
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=60)
    floor = statistics.median(rows["posttrain validate (floor)"])
    print(f"first (training) run: {first:.1f} s; medians of {a.repeats} runs each:")
    print("| command | median | runs | ratio to validate |")
    print("| --- | --- | --- | --- |")
    for name, times in rows.items():
        med = statistics.median(times)
        print(f"| {name} | {med:.2f} s | {', '.join(f'{t:.2f}' for t in times)} | {med / floor:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
