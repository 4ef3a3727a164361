"""Which Prefect API a run talks to, and a temporary one that cannot outlive the run.

In order: PREFECT_API_URL when the user set it; the server `posttrain ui` runs for this
POSTTRAIN_HOME (its address is in $POSTTRAIN_HOME/prefect/server.json), so CLI runs show up live in
the UI and no second API opens the same SQLite file; otherwise a temporary API server of our own.

Prefect's own temporary server is a plain child process: if `posttrain run` is SIGKILLed (the OOM
killer, a preempted node) it lives on, one more per crash. Ours is started with PR_SET_PDEATHSIG,
so the kernel kills it with the run. Starts are serialised by a lock, so two first runs on a fresh
home do not race on creating Prefect's database.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pipeline.launch.processes import die_with_parent, free_port
from pipeline.store.home import home, server_record
from pipeline.store.locks import held, lock_path

STARTUP_TIMEOUT_S = 120


def healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    import httpx

    try:
        return httpx.get(f"{api_url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def running_server() -> str | None:
    """The API of a live `posttrain ui` server for this home, if there is one."""
    try:
        record = json.loads(server_record().read_text())
    except (OSError, ValueError):
        return None
    return record["api_url"] if healthy(record["api_url"]) else None


def start_temporary_server() -> tuple[str, subprocess.Popen]:
    """Start a Prefect API on a free localhost port that dies with this process (PDEATHSIG); call
    `wait_until_up` before using it. Prefect is not imported here: its settings are read once, at
    import, and must see PREFECT_API_URL."""
    prefect_dir = Path(importlib.util.find_spec("prefect").origin).parent
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    log = open(home() / "prefect" / "temporary-server.log", "ab")
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_dir.parent),
                             "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "error", "--lifespan", "on"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
                            # its own session: a terminal's Ctrl-C (SIGINT to the foreground group) must
                            # not take the API away from the run it interrupts; PDEATHSIG still ends it
                            start_new_session=True)
    atexit.register(_stop, proc)
    return api_url, proc


def wait_until_up(api_url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not healthy(api_url, timeout_s=1.0):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise RuntimeError(f"the temporary Prefect API did not start; see {home() / 'prefect'}/temporary-server.log")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def connect(while_starting=lambda: None) -> str:
    """Point this process at a Prefect API (before Prefect is imported) and say which one.
    `while_starting` runs while a temporary server boots (imports, say), to overlap the two."""
    if os.environ.get("PREFECT_API_URL"):
        while_starting()
        return f"Prefect API {os.environ['PREFECT_API_URL']} (PREFECT_API_URL)"
    (home() / "prefect").mkdir(parents=True, exist_ok=True)
    if url := running_server():
        os.environ["PREFECT_API_URL"] = url
        while_starting()
        return f"Prefect server {url} (posttrain ui; runs show up there live)"
    with held(lock_path("prefect-start")):  # one migration of a fresh database at a time
        url, proc = start_temporary_server()
        os.environ["PREFECT_API_URL"] = url
        while_starting()
        wait_until_up(url, proc)
    return f"temporary Prefect API {url} (pid {proc.pid}; ends with this run)"
