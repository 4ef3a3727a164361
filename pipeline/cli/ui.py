"""`posttrain ui`: the Prefect server and the MLflow UI on localhost, both reading POSTTRAIN_HOME; it
also closes, within seconds, any run of this home whose process died."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.launch.processes import die_with_parent
from pipeline.store.home import server_record, tracking_uri, write_server_record

CLOSE_DEAD_RUNS_EVERY_S = 10


def close_dead_runs(api_url: str) -> None:
    """Close the runs of this home whose process died (pipeline.crashed_runs), so both UIs show them
    ended within seconds rather than at the next `posttrain run`. Prefect and MLflow are imported
    only when there is one: most checks read a few run records and stop."""
    from pipeline.store import runs

    if not (runs.dead_runs() or runs.left_open()):
        return
    os.environ.setdefault("PREFECT_API_URL", api_url)  # before Prefect is first imported here
    from pipeline.crashed_runs import close_crashed_runs, close_left_open

    try:
        close_crashed_runs(lambda line: print(f"posttrain ui: {line}", flush=True))
        close_left_open(lambda line: print(f"posttrain ui: {line}", flush=True))
    except Exception as e:  # a server still starting, say: the next check tries again
        print(f"posttrain ui: could not close a dead run yet ({type(e).__name__}: {e})", flush=True)


def start_uis(host: str = "127.0.0.1", prefect_port: int = 4200, mlflow_port: int = 5000) -> int:
    bindir = Path(sys.executable).parent
    # Each server in its own process group (stopped as a group: mlflow ui has uvicorn workers) and
    # killed by the kernel if this process is (PR_SET_PDEATHSIG).
    group = {"start_new_session": True, "preexec_fn": die_with_parent}
    # The UI's own calls go to PREFECT_UI_API_URL, which defaults to port 4200 whatever --port says.
    prefect_env = {**os.environ, "PREFECT_SERVER_API_HOST": host, "PREFECT_SERVER_API_PORT": str(prefect_port),
                   "PREFECT_UI_API_URL": f"http://{host}:{prefect_port}/api"}
    prefect_env.pop("PREFECT_API_URL", None)
    procs = [
        subprocess.Popen([str(bindir / "prefect"), "server", "start", "--host", host, "--port", str(prefect_port)],
                         env=prefect_env, **group),
        subprocess.Popen([str(bindir / "mlflow"), "ui", "--backend-store-uri", tracking_uri(),
                          "--host", host, "--port", str(mlflow_port)], **group),
    ]
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored (`cmd &`)
    print(f"Prefect UI: http://{host}:{prefect_port}   (runs from `posttrain serve` appear here)\n"
          f"MLflow UI:  http://{host}:{mlflow_port}   (experiments posttrain/<recipe>; parent run = pipeline)\n"
          f"state in {os.environ.get('POSTTRAIN_HOME', '.posttrain')}; Ctrl-C stops both")
    # `posttrain run` and `serve` use this server, and link stages to this MLflow UI.
    api_url = f"http://{host}:{prefect_port}/api"
    write_server_record(api_url, procs[0].pid, f"http://{host}:{mlflow_port}")
    checked, status = time.monotonic(), 0
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(1)
            if time.monotonic() - checked >= CLOSE_DEAD_RUNS_EVERY_S:
                close_dead_runs(api_url)
                checked = time.monotonic()
        for name, p in zip(("the Prefect server", "the MLflow UI"), procs):
            if p.poll() is not None:  # never a silent exit: say which one died, and how
                print(f"posttrain ui: {name} (pid {p.pid}) exited with code {p.returncode}; stopping the other. "
                      "Runs going on keep training; start `posttrain ui` again to watch them.", file=sys.stderr, flush=True)
        status = 1
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        server_record().unlink(missing_ok=True)
    return status
