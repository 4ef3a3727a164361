"""The Prefect and MLflow UIs as a user drives them: `posttrain ui` and `posttrain serve` on this
session's home, a real headless browser (Playwright driving Debian's chromium; Playwright's own
browser download is not reachable here), recipes launched from the deployment's run form.

Screenshots go to test-artifacts/browser/ (or $POSTTRAIN_TEST_ARTIFACTS/browser/)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import warnings
from pathlib import Path

import httpx
import mlflow
import pytest

from pipeline.launch.prefect_api import healthy
from pipeline.launch.processes import free_port
from pipeline.store.home import tracking_uri
from tests.conftest import POSTTRAIN, REPO, cli_env, parent_pid, paused_once_training

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("POSTTRAIN_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(os.environ.get("POSTTRAIN_TEST_ARTIFACTS", REPO / "test-artifacts")) / "browser"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _wait(what: str, ok, timeout_s: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert proc.poll() is None, f"{what} exited; log:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} not ready after {timeout_s} s; log:\n{log.read_text()[-3000:]}"
        time.sleep(1)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def uis(home, tiny_model, tmp_path_factory):
    """`posttrain ui` (Prefect server + MLflow UI) and `posttrain serve` (the deployments), as a user
    starts them in two terminals; serve finds the running server through the home."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium as root "
                    "(apt-get install chromium); set POSTTRAIN_CHROMIUM to use another")
    logs = tmp_path_factory.mktemp("ui-logs")
    env = cli_env(home)
    env.pop("PREFECT_API_URL", None)  # the session's test harness; the UI brings its own server
    prefect_port, mlflow_port = free_port(), free_port()
    prefect, mlflow_ui = f"http://127.0.0.1:{prefect_port}", f"http://127.0.0.1:{mlflow_port}"
    procs = []
    try:
        ui_log = logs / "ui.log"
        procs.append(subprocess.Popen([POSTTRAIN, "ui", "--prefect-port", str(prefect_port), "--mlflow-port",
                                       str(mlflow_port)], cwd=REPO, env=env, stdout=ui_log.open("wb"),
                                      stderr=subprocess.STDOUT, start_new_session=True))
        _wait("posttrain ui (Prefect)", lambda: healthy(f"{prefect}/api"), 180, procs[0], ui_log)
        _wait("posttrain ui (MLflow)", lambda: healthy(mlflow_ui), 180, procs[0], ui_log)
        serve_log = logs / "serve.log"
        procs.append(subprocess.Popen([POSTTRAIN, "serve", "--profile", "tiny"], cwd=REPO, env=env,
                                      stdout=serve_log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True))

        def deployments() -> int:
            return len(httpx.post(f"{prefect}/api/deployments/filter", json={}, timeout=5).json())
        _wait("posttrain serve", lambda: deployments() >= 8, 180, procs[1], serve_log)
        assert f"using Prefect server {prefect}/api" in serve_log.read_text(), "serve must use the running server"
        yield {"prefect": prefect, "mlflow": mlflow_ui, "serve_log": serve_log, "ui": procs[0], "serve": procs[1]}
    finally:
        for proc in reversed(procs):
            _stop(proc)


@pytest.fixture(scope="module")
def browser(uis):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A page per test, closed after it: an open Prefect page keeps headless chromium rendering
    (measured: 70-90% of a core), which the training the next test waits on would share."""
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    # Generous: under the two-worker mode chromium, the Prefect server and a stage worker share the
    # 2 cores with the other worker's tests, and a form's navigation once took over 60 s.
    pg.set_default_timeout(180_000)
    yield pg
    pg.close()


def _flow_runs(api: str, deployment_id: str) -> list[dict]:
    return httpx.post(f"{api}/flow_runs/filter", timeout=10,
                      json={"deployments": {"id": {"any_": [deployment_id]}}}).json()


def launch_from_form(page, base: str, recipe: str, overrides: list[str], shot: str) -> str:
    """Deployments -> recipe -> Run -> Custom run; profile `tiny` picked from its dropdown, the
    overrides typed into the list; Submit. Returns the new flow run's id."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(f"{base}/deployments")
    page.get_by_role("link", name=recipe, exact=True).click()
    page.wait_for_url("**/deployments/deployment/**")
    deployment_id = page.url.split("/deployments/deployment/")[1].split("?")[0]
    before = {r["id"] for r in _flow_runs(f"{base}/api", deployment_id)}
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text("Custom run").click()
    page.wait_for_url("**/run?**")
    page.get_by_text("Run Name").wait_for()
    profile = page.locator('button.p-select-button__control[modelvalue="tiny"]')
    tiny = page.get_by_role("option", name="tiny", exact=True)
    for _ in range(20):  # the select opens from the keyboard (a click toggles it twice), once the form is live
        profile.focus()
        page.keyboard.press("ArrowDown")
        try:
            tiny.wait_for(state="visible", timeout=1000)
            break
        except PlaywrightTimeout:
            continue
    assert {"demo", "gpu", "tiny"} <= {o.inner_text() for o in page.get_by_role("option").all()}
    tiny.click()
    for text in overrides:
        page.locator("button.p-draggable-list__create-button").click()
        page.locator(".p-draggable-list textarea").last.fill(text)
    page.screenshot(path=SHOTS / shot, full_page=True)
    new = _submit(page, base, deployment_id, before, shot)
    assert len(new) == 1, f"one Submit, one flow run: {new}"
    page.wait_for_url("**tab=Runs**")  # the form hands over to the deployment's runs
    return new[0]


def _submit(page, base: str, deployment_id: str, before: set[str], shot: str, attempts: int = 3) -> list[str]:
    """Submit the form and wait for what it is for: a new flow run in the API.

    Under the two-worker suite the Prefect server shares 2 cores with training; once (CI, stop 47)
    a Submit produced neither a run nor a navigation in 180 s. The form is what a user would see
    then, so it is kept (a screenshot and its text, in a warning or the failure), and Submit is
    pressed again as a user would, only while the button is enabled (the form disables it while a
    create is in flight) and no run has appeared. A form that never creates a run still fails."""
    seen = []
    for attempt in range(1, attempts + 1):
        page.get_by_role("button", name="Submit").click()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if new := [r["id"] for r in _flow_runs(f"{base}/api", deployment_id) if r["id"] not in before]:
                if attempt > 1:  # a warning, so that CI's summary shows it, not only a failure's output
                    warnings.warn(f"the form created its run on Submit {attempt}; before it: {seen}", stacklevel=2)
                return new
            time.sleep(1)
        stuck = SHOTS / shot.replace(".png", f"_submit{attempt}.png")
        page.screenshot(path=stuck, full_page=True)
        seen.append(f"after Submit {attempt} ({page.url}, {stuck.name}): {page.inner_text('body')[-1500:]!r}")
    pytest.fail("the form created no flow run:\n" + "\n".join(seen))


def wait_for_flow_run(page, base: str, flow_run_id: str, shot: str, timeout_s: float = 900) -> dict:
    """Wait on the API with the page blank (a live run page keeps chromium busy), then open the
    finished run's page."""
    page.goto("about:blank")
    deadline = time.monotonic() + timeout_s
    while (run := httpx.get(f"{base}/api/flow_runs/{flow_run_id}", timeout=10).json())["state_type"] not in TERMINAL:
        assert time.monotonic() < deadline, f"flow run still {run['state_name']} after {timeout_s} s"
        time.sleep(3)
    page.goto(f"{base}/runs/flow-run/{flow_run_id}")
    page.get_by_text(run["state_name"], exact=True).first.wait_for()  # the state badge the user sees
    page.screenshot(path=SHOTS / shot, full_page=True)
    return run


def task_states(base: str, flow_run_id: str) -> dict[str, str]:
    """Task run name ("stage (kind)") -> state name, for one flow run."""
    runs = httpx.post(f"{base}/api/task_runs/filter", timeout=10,
                      json={"flow_runs": {"id": {"any_": [flow_run_id]}}}).json()
    return {r["name"].rsplit("-", 1)[0]: r["state_name"] for r in runs}


def test_qwen3_launched_from_the_deployment_form_completes_and_links_each_stage_to_mlflow(qwen3, page, uis):
    from playwright.sync_api import Error as PlaywrightError

    base = uis["prefect"]
    flow_run = launch_from_form(page, base, "qwen3", [], "qwen3_form.png")
    run = wait_for_flow_run(page, base, flow_run, "qwen3_flow_run.png")
    assert run["state_type"] == "COMPLETED", run["state"]
    assert run["parameters"]["recipe"] == "qwen3" and run["parameters"]["profile"] == "tiny"
    # One task run per stage. The session's qwen3 run trained them all, so each is Cached here.
    expected = {f"{s['name']} ({s['kind']})" for s in qwen3["stages"]}
    states = task_states(base, flow_run)
    assert set(states) == expected and len(states) == len(qwen3["stages"])
    assert set(states.values()) == {"Cached"}, states
    page.get_by_text("Task Runs", exact=True).click()
    page.get_by_text("general_rl (grpo)").first.wait_for()
    # The stage's MLflow link artifact opens that stage's run in the MLflow UI.
    page.get_by_text("Artifacts", exact=True).click()
    page.get_by_text("mlflow-general-rl", exact=True).click()
    link = page.get_by_role("link", name="MLflow run of stage general_rl")
    href = link.get_attribute("href")
    assert href.startswith(uis["mlflow"] + "/"), href
    page.goto(href)
    page.get_by_text("posttrain.stage").first.wait_for()
    assert page.get_by_text("general_rl", exact=True).count() >= 1
    page.screenshot(path=SHOTS / "mlflow_stage_run.png")
    assert "workflowType=machine_learning" in href  # MLflow 3 would open its GenAI view
    run_id = href.split("/runs/")[1].split("?")[0]
    stage_run = mlflow.MlflowClient(tracking_uri()).get_run(run_id)
    assert stage_run.data.tags["posttrain.stage"] == "general_rl"
    assert stage_run.data.tags["mlflow.parentRunId"] != qwen3["mlflow_run_id"], "a run of this pipeline run"
    # The pipeline's link opens MLflow's runs table on this run's stages, with posttrain's columns.
    page.goto(f"{base}/runs/flow-run/{flow_run}")
    page.get_by_text("Artifacts", exact=True).click()
    page.get_by_text("mlflow-stages", exact=True).click()
    # MLflow renders only the columns in view (metrics first, then tags): wide enough for all of posttrain's
    page.set_viewport_size({"width": 2200, "height": 1000})
    page.goto(page.get_by_role("link", name="MLflow: the stages of this run side by side").get_attribute("href"))
    for column in ("eval/accuracy", "eval/accuracy_lo", "eval/accuracy_hi", "change/eval/accuracy", "eval/format_rate",
                   "posttrain.stage_kind"):
        page.get_by_text(column, exact=True).first.wait_for()
    page.get_by_text(f"{len(qwen3['stages'])} matching runs").wait_for()  # the stage rows, flat
    for stage in ("cold_start", "general_rl"):  # visible without opening anything
        page.get_by_text(stage, exact=True).first.wait_for()
    with contextlib.suppress(PlaywrightError):  # MLflow's assistant panel covers part of the table
        page.locator('[aria-label="Close"]').last.click(timeout=2000)
    page.screenshot(path=SHOTS / "mlflow_stage_comparison.png")
    # The experiment's Models view: one logged model per stage output, comparable side by side.
    page.goto(f"{uis['mlflow']}/#/experiments/{stage_run.info.experiment_id}/models?workflowType=machine_learning")
    for stage in ("cold_start", "general_rl", "distill_on"):
        page.get_by_text(stage, exact=True).first.wait_for()
    page.screenshot(path=SHOTS / "mlflow_models.png")


def test_a_run_failing_at_a_stage_reruns_from_the_form_with_the_finished_stage_cached(page, uis):
    """`timeout_s: 1` on the second stage passes validation and fails at run time; the rerun from
    the form without it takes the first stage from cache and trains the second."""
    base = uis["prefect"]
    shrink = ["stages.polish.max_steps=3", "eval=null"]  # a polish stage no other test has trained
    failed = launch_from_form(page, base, "smoke", [*shrink, "stages.polish.launcher.timeout_s=1"],
                              "smoke_failing_form.png")
    run = wait_for_flow_run(page, base, failed, "smoke_failed.png")
    assert run["state_type"] == "FAILED", run["state"]
    assert "timed out after 1 s" in run["state"]["message"]
    states = task_states(base, failed)
    assert states["polish (sft)"] == "Failed" and states["cold_start (sft)"] in {"Completed", "Cached"}

    fixed = launch_from_form(page, base, "smoke", shrink, "smoke_fixed_form.png")
    run = wait_for_flow_run(page, base, fixed, "smoke_fixed.png")
    assert run["state_type"] == "COMPLETED", run["state"]
    assert task_states(base, fixed) == {"cold_start (sft)": "Cached", "polish (sft)": "Completed"}
    page.get_by_text("Task Runs", exact=True).click()
    page.get_by_text("Cached", exact=True).first.wait_for()
    page.screenshot(path=SHOTS / "smoke_fixed_task_runs.png", full_page=True)


def test_a_killed_terminal_run_is_closed_by_the_ui_within_seconds(page, uis, home, tmp_path):
    """A `posttrain run` from a terminal joins the UI's server. SIGKILLed mid-stage, with no later
    run, `posttrain ui` closes it (the kernel released its run lock): Crashed in Prefect, KILLED in
    MLflow, `crashed` in its record."""
    env = cli_env(home)
    env.pop("PREFECT_API_URL", None)
    before = set((home / "runs").glob("*.json"))
    log = tmp_path / "run.log"
    proc = subprocess.Popen([POSTTRAIN, "run", "smoke", "--profile", "tiny", "--set", "stages.cold_start.max_steps=500",
                             "--set", "eval=null"], cwd=REPO, env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)

    def record() -> dict | None:
        new = [p for p in (home / "runs").glob("*.json") if p not in before]
        return json.loads(new[0].read_text()) if new else None
    _wait("the run's first stage", lambda: (r := record()) and r["stages"][0]["status"] == "running", 240, proc, log)
    # mid-stage: its worker is up, so Prefect has heard of the task run (a kill between the record's
    # update and the task's first event would leave no task run to close)
    _wait("the stage's worker", lambda: any(p.stat().st_mtime >= record()["started"] for p in
                                            (home / "stages" / "smoke").glob("cold_start-*.partial/worker.pid")),
          240, proc, log)
    assert f"using Prefect server {uis['prefect']}/api" in log.read_text()
    proc.send_signal(signal.SIGKILL)  # the run's process alone
    proc.wait()
    dead = record()
    deadline = time.monotonic() + 60
    while record()["status"] != "crashed":  # the closer ends MLflow's and Prefect's runs first, the record last
        assert time.monotonic() < deadline, f"run still {record()['status']} 60 s after its process was killed"
        time.sleep(1)
    run = httpx.get(f"{uis['prefect']}/api/flow_runs/{dead['prefect_flow_run_id']}", timeout=10).json()
    assert run["state_type"] == "CRASHED" and record()["stages"][0]["status"] == "crashed", run["state_name"]
    assert task_states(uis["prefect"], dead["prefect_flow_run_id"]) == {"cold_start (sft)": "Crashed"}
    assert mlflow.MlflowClient(tracking_uri()).get_run(dead["mlflow_run_id"]).info.status == "KILLED"
    page.goto(f"{uis['prefect']}/runs/flow-run/{dead['prefect_flow_run_id']}")
    page.get_by_text("Crashed", exact=True).first.wait_for()
    page.screenshot(path=SHOTS / "smoke_killed_crashed.png", full_page=True)


def test_a_prefect_server_that_goes_away_mid_stage_loses_no_work_and_serve_exits_in_seconds(uis, home, tmp_path):
    """Last in this module: it takes the UI's Prefect server away while a terminal run trains.
    The run's stages go on and are published; the run names the Prefect API that went away; `posttrain
    serve` exits within seconds of SIGTERM (Prefect's own shutdown would pause every deployment
    through the dead API and wait on it for good); `posttrain ui` says which server died; and once a
    server is back, the dead run's flow run is closed."""
    ui, serve = uis["ui"], uis["serve"]
    env = cli_env(home)
    env.pop("PREFECT_API_URL", None)
    before = set((home / "runs").glob("*.json"))
    log = tmp_path / "run.log"
    launched = time.time()
    run = subprocess.Popen([POSTTRAIN, "run", "smoke", "--profile", "tiny", "--set", "stages.cold_start.max_steps=100",
                            "--set", "stages.cold_start.save_steps=1000", "--set", "eval=null"],
                           cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def record() -> dict | None:
        new = [p for p in (home / "runs").glob("*.json") if p not in before]
        return json.loads(new[0].read_text()) if new else None

    with paused_once_training(home / "stages" / "smoke", "cold_start", launched, run, log) as partial:
        # all this happens while the stage has steps to go
        published = partial.with_suffix("")
        (server,) = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and parent_pid(p) == ui.pid
                     and b"prefect" in (p / "cmdline").read_bytes()]
        os.killpg(server, signal.SIGKILL)
        time.sleep(2)
        started = time.monotonic()
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=30)
        assert time.monotonic() - started < 10, uis["serve_log"].read_text()[-2000:]
        assert ui.wait(timeout=30) == 1  # and the UI said which server died

    # Prefect 3 orchestrates tasks in the run's own process: every stage trains and is published,
    # and only the flow run's last state update is lost. The run says so and succeeds.
    assert run.wait(timeout=600) == 0, log.read_text()[-3000:]
    out = log.read_text()
    assert f"completed, but the Prefect API at {uis['prefect']}/api does not answer" in out, out[-3000:]
    assert json.loads((published / "result.json").read_text())["metrics"]["train/global_step"] == 100, out[-3000:]
    dead = record()
    assert dead["status"] == "completed" and dead["services_closed"] is False

    port = uis["prefect"].rsplit(":", 1)[1]  # a server back on the same address closes what the run left open
    again = subprocess.Popen([POSTTRAIN, "ui", "--prefect-port", port, "--mlflow-port", str(free_port())], cwd=REPO,
                             env=env, stdout=(tmp_path / "ui.log").open("wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        def closed() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                flow_run = httpx.get(f"{uis['prefect']}/api/flow_runs/{dead['prefect_flow_run_id']}", timeout=5).json()
                return flow_run["state_type"] == "COMPLETED"
            return False
        # the closer ends the flow run first and marks the record last: wait for the mark
        _wait("the dead run to be closed", lambda: record().get("services_closed"), 180, again, tmp_path / "ui.log")
        assert closed()
    finally:
        _stop(again)
