"""Runs whose process died (SIGKILL, the OOM killer, a lost node) are closed by the next run.

Every pipeline run holds `$POSTTRAIN_HOME/locks/runs/<id>.lock` while its flow runs, and the kernel
releases it when the process dies. A record that still says `running` while nobody holds its lock
belongs to a dead run (`runs.died`). `posttrain list` and `show` already show it as `crashed`. The
next `posttrain run` on the home, or `posttrain ui` within seconds when it is running, closes it
everywhere, so no UI shows it live forever:
- the run record: status `crashed`, and the stage that was running `crashed`;
- MLflow: the pipeline run and any stage run still RUNNING under it end as KILLED;
- Prefect: the flow run and its unfinished task runs go to Crashed, unless the flow run already ended.
The dead run's work is untouched: its stage's `.partial` directory is what the next run resumes.

A run that ended (failed, interrupted) while MLflow or Prefect could not be reached leaves its
runs there open although its record is final; the same closers end those (`close_left_open`:
MLflow FAILED or KILLED, Prefect Crashed) and mark the record `services_closed`, once.
"""

from __future__ import annotations

import contextlib
import time

from pipeline.store import runs
from pipeline.store.locks import held
from pipeline.tracking import mlflow_runs


def close_crashed_runs(say=print) -> list[str]:
    """Close every dead run of this home; returns their ids."""
    closed = []
    for record in runs.dead_runs():
        with held(runs.run_lock(record["id"])):  # one closer per record; then check again under the lock
            record = runs.load(record["id"])
            if record.get("status") != "running":
                continue
            _close(record)
        say(f"run {record['id']} had died without ending (its process is gone); closed it as crashed")
        closed.append(record["id"])
    return closed


ENDED_OPEN = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED", "crashed": "KILLED"}


def close_left_open(say=print) -> list[str]:
    """End the MLflow and Prefect runs of ended runs that could not end them (a service was down);
    a service still down is tried again next time. Returns the run ids closed."""
    closed = []
    for record in runs.left_open():
        with held(runs.run_lock(record["id"])):
            record = runs.load(record["id"])
            if not runs.is_left_open(record):
                continue
            try:
                if parent := record.get("mlflow_run_id"):
                    _kill_mlflow_runs(parent, ENDED_OPEN[record["status"]])
                if flow_run_id := record.get("prefect_flow_run_id"):
                    _crash_flow_run(flow_run_id, record["id"], completed=record["status"] == "completed")
            except Exception as e:  # a service still unreachable: the next closer tries again
                say(f"run {record['id']}: could not close its MLflow/Prefect runs yet ({type(e).__name__})")
                continue
            record["services_closed"] = True
            runs.save(record)
        closed.append(record["id"])
    return closed


def _close(record: dict) -> None:
    """The record last: if MLflow or Prefect cannot be reached, it still says `running`, and the
    next closer tries again."""
    if parent := record.get("mlflow_run_id"):
        _kill_mlflow_runs(parent)
    if flow_run_id := record.get("prefect_flow_run_id"):
        _crash_flow_run(flow_run_id, record["id"])
    for stage in record["stages"]:
        if stage["status"] == "running":
            stage["status"] = "crashed"
    record.update(status="crashed", closed=time.time())  # when it died is not known; when it was closed is
    runs.save(record)


def _kill_mlflow_runs(parent: str, status: str = "KILLED") -> None:
    from mlflow.exceptions import MlflowException

    c = mlflow_runs.client()
    try:
        experiment = mlflow_runs.experiment_of(parent)
    except MlflowException:  # the store was moved or reset: nothing there to close
        return
    live = c.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent}' and attributes.status = 'RUNNING'")
    for run in live:
        c.set_terminated(run.info.run_id, status)
    if c.get_run(parent).info.status == "RUNNING":
        c.set_terminated(parent, status)


def _crash_flow_run(flow_run_id: str, run_id: str, completed: bool = False) -> None:
    """The flow run and its unfinished task runs (the stage that was running) go to Crashed; the
    flow run of a run that completed (its API went away at the end) goes to Completed."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Completed, Crashed

    message = f"posttrain run {run_id} ended without closing this flow run; closed afterwards by posttrain"
    with get_client(sync_client=True) as client, contextlib.suppress(ObjectNotFound):
        flow_run = client.read_flow_run(UUID(flow_run_id))
        if flow_run.state and flow_run.state.is_final():
            return
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
        for task_run in tasks:
            if not (task_run.state and task_run.state.is_final()):
                client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
        client.set_flow_run_state(flow_run.id, (Completed if completed else Crashed)(message=message), force=True)
