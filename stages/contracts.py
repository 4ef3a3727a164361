"""The typed contracts between the orchestrator and the stage kinds, in one place:

    StagePlan    what the flow decided for one stage: its resolved inputs, cache key, output
                 directory, launcher, and whether (and how) it is evaluated: `eval` is the only
                 place that decision is made
    WorkerSpec   what the flow hands the worker process (spec.json): the plan's part the worker
                 needs, the partial output directory, and the MLflow run to write into
    StageOutput  what a kind's `run(cfg, ctx)` returns: output paths (relative to its directory),
                 metrics, and files, tables and tags for its MLflow run
    StageResult  the published record (result.json, the Prefect cache value): the output plus
                 the stage's identity, where it lives, its MLflow run and its outputs' checksums
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stages.launch import LaunchSpec


class Contract(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Lineage(Contract):
    """Where one input of a stage came from, as MLflow records it: datasets as run inputs, and the
    MLflow run of the upstream stage that produced a model or dataset."""
    type: Literal["model", "dataset"]
    name: str = Field(description="the recipe's reference: a source name, a model name, or `stage.output`")
    source: str = Field(description="a path, or `posttrain:SOURCE?...` for a built-in source")
    digest: str = Field(description="the input's content fingerprint (its part of the cache key)")
    rows: int | None = None
    context: Literal["train", "eval"] = "train"
    upstream_run: str | None = Field(None, description="the MLflow run of the stage that produced it")


class StagePlan(Contract):
    name: str
    kind: str
    recipe: str
    config: dict
    inputs: dict
    fingerprints: dict[str, str]
    eval: dict | None = Field(description="the resolved EvalSpec, or None: this stage is not evaluated")
    cache_key: str
    output_dir: str
    launcher: LaunchSpec
    baseline: dict | None = Field(None, description="{input, path}: evaluate this input model, once per model "
                                  "and eval spec (cached at `path`), for deltas and gates")
    reused_evals: list[str] = Field(default_factory=list, description="model fields (REFERENCE_EVALS) an upstream "
                                    "stage evaluated: not evaluated again (pipeline.gates.reused_evaluations)")
    deepspeed_config: str | None = None
    lineage: dict[str, Lineage] = Field(default_factory=dict, description="per input, for MLflow")


class WorkerSpec(Contract):
    kind: str
    stage: dict
    inputs: dict
    eval: dict | None
    output_dir: str
    deepspeed_config: str | None = None
    flow_pid: int | None = None
    mlflow_run_id: str | None = None
    baseline: dict | None = None
    reused_evals: list[str] = Field(default_factory=list)

    @classmethod
    def from_plan(cls, plan: StagePlan, output_dir: str, flow_pid: int, mlflow_run_id: str | None) -> WorkerSpec:
        return cls(kind=plan.kind, stage=plan.config, inputs=plan.inputs, eval=plan.eval, output_dir=output_dir,
                   deepspeed_config=plan.deepspeed_config, flow_pid=flow_pid, mlflow_run_id=mlflow_run_id,
                   baseline=plan.baseline, reused_evals=plan.reused_evals)


class StageOutput(Contract):
    outputs: dict[str, str]
    metrics: dict[str, float] = Field(default_factory=dict)
    artifacts: list[str] = Field(default_factory=list, description="files in the output dir to log to MLflow")
    tables: dict[str, dict] = Field(default_factory=dict, description="MLflow tables: artifact file -> columns")
    tags: dict[str, str] = Field(default_factory=dict)


class StageResult(Contract):
    name: str
    kind: str
    cache_key: str
    output_dir: str
    mlflow_run_id: str | None
    outputs: dict[str, str]
    metrics: dict[str, float]
    fingerprints: dict[str, str]
    reused: bool = Field(False, description="served from the published directory, not trained by this call")
