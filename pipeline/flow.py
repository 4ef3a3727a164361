"""The pipeline: a Prefect flow that runs a recipe's stages in order, each as a cached task.

Data flow, top to bottom:
  recipe YAML + profile + --set  -> ResolvedRecipe (validated before any compute)
  for each stage:
      inputs (upstream outputs or sources) + content fingerprints + resolved config + code version
          -> cache key -> output dir  $POSTTRAIN_HOME/stages/<recipe>/<stage>-<key>/
      Prefect task keyed on that cache key: Cached when an identical stage already finished;
      otherwise a worker trains in <dir>.partial (resuming from its checkpoints if a previous try
      died), evaluates, and the directory is renamed into place when complete.
      MLflow: a child run under the pipeline's parent run (params, step metrics, eval, artifacts).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.exceptions import ExternalSignal

from pipeline.crashed_runs import close_crashed_runs, close_left_open
from pipeline.gates import GateFailed, candidate_refusal, gate_failure, input_metrics
from pipeline.launch import warm
from pipeline.launch.workers import run_worker
from pipeline.plan import plan_stage
from pipeline.recipe import (
    ResolvedRecipe,
    list_profiles,
    list_recipes,
    load_recipe,
)
from pipeline.store import runs
from pipeline.store.home import home, publish_dir
from pipeline.store.locks import held, model_lock, stage_lock
from pipeline.tracking import logged_models, mlflow_runs
from stages.contracts import StageOutput, StagePlan, StageResult, WorkerSpec
from toolkit.core.files import corrupt_files, dir_fingerprint, quarantine, write_json_atomic, write_manifest

RecipeName = Literal[tuple(list_recipes())]  # dropdowns in the Prefect UI
ProfileName = Literal[tuple(list_profiles())]


def _artifact_key(*parts: str) -> str:
    return "-".join(p.lower().replace("_", "-") for p in parts)[:60]


@task(cache_key_fn=lambda ctx, params: params["cache_key"], persist_result=True, result_serializer="json")
def execute_stage(cache_key: str, plan: StagePlan, parent_run_id: str) -> dict:
    """Train + evaluate one stage into a partial dir, then publish it. Returns the StageResult (as a
    dict: it is the Prefect cache value). One writer per output: a second run of the same stage
    waits on the stage's lock, then takes the published result."""
    logger = get_run_logger()
    final = Path(plan.output_dir)

    def waiting(holder: str) -> None:
        logger.info("stage %s is being trained by another run (pid %s); waiting for it", plan.name, holder)

    with held(stage_lock(final.name), on_wait=waiting):
        # published earlier, or by the run we waited for, under this recipe's folder or another's
        for done in [final / "result.json", *sorted((home() / "stages").glob(f"*/{final.name}/result.json"))]:
            if done.exists():
                return {**json.loads(done.read_text()), "reused": True}
        return _train_stage(cache_key, plan, parent_run_id, final, logger)


def _train_stage(cache_key: str, plan: StagePlan, parent_run_id: str, final: Path, logger) -> dict:
    partial = final.with_name(final.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    write_json_atomic(partial / "stage_config.json", plan.model_dump(
        mode="json", include={"name", "kind", "config", "inputs", "eval", "cache_key", "fingerprints"}))
    child = mlflow_runs.start_stage_run(parent_run_id, plan.recipe, plan.name, plan.kind, plan.config, cache_key,
                                        lineage=plan.lineage)
    _link_mlflow_run(child, plan.name)
    progress_id = _decoration(create_progress_artifact, 0.0, key=_artifact_key("progress", plan.name))
    spec = WorkerSpec.from_plan(plan, str(partial), os.getpid(), child)
    write_json_atomic(partial / "spec.json", spec.model_dump(mode="json"))
    env = {"MLFLOW_TRACKING_URI": mlflow_runs.tracking_uri(), "POSTTRAIN_HOME": str(home())}

    def on_progress(p: dict) -> None:
        if p.get("max_steps"):
            _decoration(update_progress_artifact, progress_id, 100.0 * p["step"] / p["max_steps"])
            logger.info("stage %s: step %s/%s %s", plan.name, p["step"], p["max_steps"],
                        {k: v for k, v in (p.get("logs") or {}).items() if k in ("loss", "reward", "learning_rate")})

    logger.info("stage %s (%s): output %s; log %s", plan.name, plan.kind, final, partial / "worker.log")
    try:
        run_worker(partial / "spec.json", plan.launcher, partial / "worker.log", env, on_progress, _run_in_this_process)
        output = StageOutput.model_validate_json((partial / "result.json").read_text())
        result = StageResult(name=plan.name, kind=plan.kind, cache_key=cache_key, mlflow_run_id=child,
                             output_dir=str(final), outputs=output.outputs, metrics=output.metrics,
                             fingerprints={o: dir_fingerprint(partial / rel) for o, rel in output.outputs.items()})
        shutil.rmtree(partial / "checkpoints", ignore_errors=True)  # the final model supersedes them
        write_json_atomic(partial / "result.json", result.model_dump())
        write_manifest(partial, output.outputs)  # checked whenever the output is taken again (pipeline.store.verify)
        publish_dir(partial, final)
    except BaseException:
        with contextlib.suppress(Exception):  # a tracking server that is down: the next run's closer ends it
            mlflow_runs.end_run(child, ok=False)
        raise
    # Published first, tracked second: a tracking server that went away fails the run here (the CLI
    # names it) but loses no training; the next run takes this output and replays the spool.
    _log_to_mlflow(child, final, output, result, logger)
    _decoration(update_progress_artifact, progress_id, 100.0)
    _decoration(create_table_artifact, [{"metric": k, "value": round(v, 6)} for k, v in sorted(result.metrics.items())],
                key=_artifact_key("metrics", plan.name), description=f"stage {plan.name}")
    return result.model_dump()


def _run_in_this_process(spec: WorkerSpec) -> None:
    from pipeline.worker import run_spec  # imports torch: only the in-process launcher mode pays for it

    run_spec(spec)


def _log_to_mlflow(child: str, final: Path, output: StageOutput, result: StageResult, logger) -> None:
    """MLflow's copy of a published stage: the step metrics it missed, outputs, tags; then ended."""
    _replay_spool(child, final, logger)
    samples = final / "eval_samples.json"
    mlflow_runs.log_stage_output(child, final, output, json.loads(samples.read_text()) if samples.exists() else None)
    mlflow_runs.tag_published(child, str(final), result.fingerprints)
    mlflow_runs.end_run(child, ok=True)


def _replay_spool(run_id: str, output_dir: Path, logger) -> None:
    if replayed := mlflow_runs.replay_spool(run_id, output_dir / mlflow_runs.SPOOL):
        logger.info("%s: %d steps of metrics the tracking server missed are logged now", output_dir.name, replayed)


_prefect_down: list[str] = []  # set once the Prefect API fails a call; decorations stop being tried


def _decoration(create, *args, **kwargs):
    """A Prefect artifact (progress bar, links, tables): decoration, so a Prefect API that went away
    costs one warning naming it, never the stage. Training goes on and is published; the task's own
    state update then fails the run, and the CLI says which service it was."""
    if _prefect_down:
        return None
    try:
        return create(*args, **kwargs)
    except Exception as e:
        _prefect_down.append(os.environ.get("PREFECT_API_URL", "?"))
        get_run_logger().warning("the Prefect API at %s does not answer (%s); the stage goes on without its "
                                 "progress artifacts", _prefect_down[0], type(e).__name__)
        return None


def _artifact_mode(resolved: ResolvedRecipe) -> str:
    return resolved.recipe.tracking.model_artifacts or logged_models.default_mode()


def _file_model(resolved: ResolvedRecipe, stage, final: bool, result: StageResult, child: str, entry: dict) -> None:
    """The stage's model as an MLflow logged model (made once per output, whichever run trained it),
    and, for the final stage or one with `register:`, as a registry version with alias candidate."""
    mode = _artifact_mode(resolved)
    model_dir = Path(result.output_dir) / result.outputs["model"]
    with held(model_lock(Path(result.output_dir).name)):  # a run that waited finds the model the first one logged
        model_id = logged_models.ensure_logged_model(result.mlflow_run_id, child, stage.name, model_dir,
                                                     result.fingerprints["model"], result.metrics, mode)
    entry["logged_model_id"] = model_id
    if stage.registry is False or not (final or stage.registry):
        return
    name = stage.registry if isinstance(stage.registry, str) else f"posttrain-{resolved.recipe.name}"
    tags = {"posttrain.recipe": resolved.recipe.name, "posttrain.profile": str(resolved.profile),
            "posttrain.stage": stage.name, "posttrain.git_commit": mlflow_runs.git_commit()}
    refused = candidate_refusal(Path(result.output_dir), logged_models.candidate_output_dir(name))
    entry["registry"] = {"name": name, "version": logged_models.register(model_id, name, child, tags, refused),
                         "alias": None if refused else logged_models.CANDIDATE}
    if refused:
        entry["registry"]["candidate_refused"] = refused
        get_run_logger().warning("%s: candidate stays where it was: %s", name, refused)


def _execute(stage, plan: StagePlan, parent: str, entry: dict):
    """Run (or take from the cache) one stage; the run record says how long it took and why it failed."""
    done_before = (Path(plan.output_dir) / "result.json").exists()
    if not done_before and warm.applies(plan.launcher):
        warm.start_server()  # from the flow's thread, so the server dies with the flow (pipeline.launch.warm)
    state = execute_stage.with_options(name=f"{stage.name} ({stage.kind})", refresh_cache=not done_before)(
        plan.cache_key, plan, parent, return_state=True)
    entry["duration_s"] = time.time() - entry["started"]
    if state.is_failed():
        entry.update(status="failed", error=str(state.message)[-2000:])
        state.result()  # raises the stage's error
    return state


def _record_cached(parent_id: str, plan: StagePlan, result: StageResult) -> str:
    """A child run for a stage served from cache, so this pipeline run compares complete in MLflow."""
    child = mlflow_runs.start_stage_run(parent_id, plan.recipe, plan.name, plan.kind, plan.config,
                                        plan.cache_key, cached_from=result.mlflow_run_id, lineage=plan.lineage)
    mlflow_runs.log_metrics(child, result.metrics)
    mlflow_runs.end_run(child, ok=True)
    _link_mlflow_run(child, plan.name)
    return child


def _link_mlflow_run(run_id: str, stage: str) -> None:
    """A link artifact on the flow run: from the Prefect UI to the stage's MLflow run."""
    _decoration(create_link_artifact, mlflow_runs.run_url(run_id), link_text=f"MLflow run of stage {stage}",
                key=_artifact_key("mlflow", stage))


@flow(name="posttrain", log_prints=True, persist_result=True)
def run_recipe(recipe: RecipeName, profile: ProfileName | None = None, overrides: list[str] | None = None,
               run_id: str | None = None) -> dict:
    """Run a recipe's stages in order; finished identical stages are served from cache."""
    from prefect.runtime import flow_run

    logger = get_run_logger()
    overrides = list(overrides or [])
    resolved = load_recipe(recipe, profile, overrides)
    run_id = run_id or runs.new_run_id(resolved.recipe.name)
    # Held while the flow runs. If the process dies, the kernel releases it; a later run closes this one.
    with held(runs.run_lock(run_id)):
        close_crashed_runs(logger.info)
        close_left_open(logger.info)
        return _run_stages(resolved, profile, overrides, run_id, str(flow_run.id or ""), logger)


def _run_stages(resolved: ResolvedRecipe, profile: str | None, overrides: list[str], run_id: str,
                flow_run_id: str, logger) -> dict:
    _prefect_down.clear()  # a long-lived process (`posttrain serve`) tries its API again with each run
    parent = mlflow_runs.start_pipeline_run(resolved.recipe.name, profile, overrides, run_id)
    record = {"id": run_id, "recipe": resolved.recipe.name, "profile": profile, "overrides": overrides,
              "started": time.time(), "status": "running", "mlflow_run_id": parent,
              "mlflow_url": mlflow_runs.run_url(parent), "mlflow_stages_url": mlflow_runs.stages_view_url(parent),
              "prefect_flow_run_id": flow_run_id,
              "stages": [{"name": s.name, "kind": s.kind, "status": "pending"} for s in resolved.recipe.stages]}
    runs.save(record)
    _decoration(create_link_artifact, record["mlflow_stages_url"],
                link_text="MLflow: the stages of this run side by side", key="mlflow-stages")
    upstream: dict[str, StageResult] = {}
    try:
        for i, stage in enumerate(resolved.recipe.stages):
            entry = record["stages"][i]
            entry.update(status="running", started=time.time())
            runs.save(record)
            plan = plan_stage(resolved, stage, upstream)
            state = _execute(stage, plan, parent, entry)
            result = StageResult.model_validate(state.result())
            if state.name == "Cached" or result.reused:
                if bad := corrupt_files(Path(result.output_dir)):  # never serve or train on flipped bytes
                    logger.warning("stage %s: its published output is corrupt, so it is trained again "
                                   "(moved aside to %s): %s", stage.name, quarantine(Path(result.output_dir)), bad)
                    state = _execute(stage, plan, parent, entry)
                    result = StageResult.model_validate(state.result())
            cached = state.name == "Cached"
            reused = cached or result.reused  # served from a published directory, not trained by this run
            if reused:  # step metrics the run that trained it could not log (its tracking server was down)
                _replay_spool(result.mlflow_run_id, Path(result.output_dir), logger)
            child = _record_cached(parent, plan, result) if reused else result.mlflow_run_id
            from_upstream = {k: v for k, v in input_metrics(stage, result, upstream).items() if k not in result.metrics}
            if from_upstream:
                mlflow_runs.log_metrics(child, from_upstream)
            entry.update(status="completed", cached=cached, reused=reused, metrics={**result.metrics, **from_upstream},
                         mlflow_run_id=child, mlflow_url=mlflow_runs.run_url(child), output_dir=result.output_dir,
                         cache_key=plan.cache_key)
            if "model" in result.outputs:
                _file_model(resolved, stage, i == len(resolved.recipe.stages) - 1, result, child, entry)
            if not reused:  # a reused stage's datasets are on the run that made them
                logged_models.log_datasets(child, stage.name, Path(result.output_dir), result.outputs,
                                           result.fingerprints, _artifact_mode(resolved))
            upstream[stage.name] = result
            how = "cached" if cached else "reused (published by another run)" if reused else "completed"
            logger.info("stage %s %s in %.1f s", stage.name, how, entry["duration_s"])
            runs.save(record)
            if stage.gate and (failure := gate_failure(stage.name, stage.gate, entry["metrics"])):
                entry["gate"] = failure
                mlflow_runs.tag_gate(child, failure)
                if stage.gate.on_fail == "stop":
                    entry["status"] = "gate_failed"
                    raise GateFailed(failure)
                logger.warning("%s; going on (on_fail: warn)", failure)
                runs.save(record)
            elif stage.gate and entry.get("registry"):  # the gate passed: this version is the champion
                logged_models.promote(entry["registry"]["name"], entry["registry"]["version"])
                entry["registry"]["alias"] = logged_models.CHAMPION
                runs.save(record)
        record["status"] = "completed"
    except BaseException as e:
        # Ctrl-C (KeyboardInterrupt) and a cancel (SIGTERM: SystemExit 143, or Prefect's own
        # TerminationSignal) interrupt the run; a stage still marked running says so too
        stopped = isinstance(e, (KeyboardInterrupt, SystemExit, ExternalSignal))
        record["status"] = "interrupted" if stopped else "failed"
        for s in record["stages"]:
            if s.get("status") == "running":
                s["status"] = "interrupted" if stopped else "failed"
        raise
    finally:
        record["finished"] = time.time()
        runs.save(record)
        try:
            done = [dict(name=s["name"], metrics=s["metrics"]) for s in record["stages"] if s.get("metrics")]
            if done:
                mlflow_runs.log_stage_comparison(parent, done, runs.comparison([record]))
            mlflow_runs.end_run(parent, ok=record["status"] == "completed")
        except Exception:
            # Every stage is published; only MLflow's copy of the run is incomplete. The record says
            # failed, so the next run (or `posttrain ui`) ends the MLflow run once the server is back.
            # A run that failed already keeps its own error (a raise here would replace it).
            if record["status"] == "completed":
                record["status"] = "failed"
                runs.save(record)
                raise
    return record
