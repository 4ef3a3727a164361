"""Pictures of one finished pipeline run for the README: MLflow's runs table with the run's stages
side by side (the link the run logs), and the run's own held-out-accuracy-by-stage plot.

    POSTTRAIN_HOME=<home> .venv/bin/python benchmarks/screenshot_run.py [RUN] --out docs/images/r1_demo

RUN defaults to the home's latest run. Starts `mlflow ui` on a free localhost port for the home's
tracking store, drives chromium with Playwright (as tests/test_ui_browser.py does), writes
`<out>_stages.png` (the screenshot) and `<out>_by_stage.png` (the `stage_comparison.png` artifact
the flow logged on the parent run), and stops the server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from recipe_runs import shown_run

CHROMIUM = "/usr/bin/chromium"


def wait_until_up(url: str, proc: subprocess.Popen, timeout_s: float = 90) -> None:
    from pipeline.launch.prefect_api import healthy  # the /health probe `posttrain` uses for its servers

    deadline = time.monotonic() + timeout_s
    while not healthy(url):
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow ui exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"mlflow ui did not answer at {url} within {timeout_s:.0f} s")
        time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", default="latest", help="run id (default: the latest)")
    parser.add_argument("--out", required=True, help="path prefix of the two PNG files")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from pipeline.launch.prefect_api import free_port
    from pipeline.store.home import tracking_uri
    from pipeline.tracking import mlflow_runs

    record = shown_run(run=args.run)
    if record is None:
        print(f"screenshot_run: no run {args.run!r} in this POSTTRAIN_HOME (posttrain show {args.run})", file=sys.stderr)
        return 2
    parent = record["mlflow_run_id"]
    url = f"http://127.0.0.1:{free_port()}"
    os.environ["POSTTRAIN_MLFLOW_UI"] = url  # the links below point at this server
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", tracking_uri(),
                               "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1]],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until_up(url, server)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = browser.new_page(viewport={"width": 2200, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(mlflow_runs.stages_view_url(parent))
            page.get_by_text(f"{len(record['stages'])} matching runs").wait_for()
            page.get_by_text("eval/accuracy", exact=True).first.wait_for()
            with contextlib.suppress(Exception):  # MLflow's assistant panel covers part of the table
                page.locator('[aria-label="Close"]').last.click(timeout=2000)
            page.screenshot(path=f"{out}_stages.png")
            browser.close()
        plot = mlflow_runs.client().download_artifacts(parent, "stage_comparison.png")
        shutil.copyfile(plot, f"{out}_by_stage.png")
        print(f"wrote {out}_stages.png and {out}_by_stage.png (run {record['id']})")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
