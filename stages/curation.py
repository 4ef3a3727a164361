"""Curation stage kinds: decontaminate, dedup, difficulty_filter, no_cot_filter, trace_filter.

Each reads one dataset (a source, a file or an earlier stage's `dataset`) and writes
`kept.jsonl` (its `dataset` output, for the next stage), `removed.jsonl`, `report.json`, examples
per reason and, for the sampling filters, a pass-rate histogram; counts go to the stage's MLflow
run and the Prefect metrics table. `posttrain curate` runs the same functions outside a recipe.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from data_curation.decontaminate import build_index, decontaminate
from data_curation.dedup import dedup
from data_curation.report import examples_table, report_metrics, write_outputs
from data_curation.sampling_filters import NO_COT_INSTRUCTION, difficulty_filter, no_cot_filter
from data_curation.sources import check_data_spec, load_rows, source_fingerprint
from data_curation.trace_filter import trace_problem
from stages.common import DataSpec, StageBase
from stages.contracts import StageOutput
from stages.runtime import load_stage_rows
from toolkit.rollouts import SamplingSpec


class CurationBase(StageBase):
    data: DataSpec
    OUTPUTS: ClassVar[tuple[str, ...]] = ("dataset",)
    DATA_FIELDS: ClassVar[tuple[str, ...]] = ("data",)


class DecontaminateConfig(CurationBase):
    kind: Literal["decontaminate"] = "decontaminate"
    eval_sets: list[DataSpec] = Field(min_length=1, description="benchmarks to protect: sources or files")
    ngram: int = Field(8, ge=1)
    mode: Literal["any", "coverage"] = "any"
    threshold: float = Field(0.5, gt=0, lt=1, description="coverage mode: share of an eval item's tokens "
                             "inside n-grams it shares with the row (Tulu 3)")

    @model_validator(mode="before")
    @classmethod
    def _whole_benchmarks(cls, value):
        """An eval set means the whole benchmark unless a split is named (DataSpec defaults to train)."""
        if isinstance(value, dict) and isinstance(value.get("eval_sets"), list):
            value = {**value, "eval_sets": [{"source": s, "split": "all"} if isinstance(s, str)
                                            else {"split": "all", **s} if isinstance(s, dict) else s
                                            for s in value["eval_sets"]]}
        return value

    def semantic_errors(self) -> list[tuple[tuple, str]]:
        errors = []
        for i, spec in enumerate(self.eval_sets):
            if spec.stage_ref:
                errors.append((("eval_sets", i, "source"), "eval sets must be named sources or files"))
            errors += [(("eval_sets", i) + rel, msg) for rel, msg in check_data_spec(spec.source, spec.params)]
        return errors

    def input_fingerprints(self) -> dict[str, str]:
        return {f"eval_sets.{i}": source_fingerprint(s.source, s.params) for i, s in enumerate(self.eval_sets)}


class DedupConfig(CurationBase):
    kind: Literal["dedup"] = "dedup"
    near: bool = Field(True, description="also drop near-duplicates (MinHash LSH), not only exact ones")
    threshold: float = Field(0.8, gt=0, le=1, description="estimated Jaccard similarity for a near-duplicate")
    num_perm: int = Field(128, ge=16)
    shingle: int = Field(5, ge=1, description="words per shingle")


class SamplingFilterBase(CurationBase):
    model: str = Field(description="the model that samples, usually an earlier stage's `x.model`")
    max_new_tokens: int = Field(256, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    batch_size: int = Field(16, ge=1)
    seed: int = 0
    trust_remote_code: bool = False
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = ("model",)

    def sampling(self, n: int):
        return SamplingSpec(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                            n=n, batch_size=self.batch_size, seed=self.seed)


class DifficultyFilterConfig(SamplingFilterBase):
    kind: Literal["difficulty_filter"] = "difficulty_filter"
    samples: int = Field(8, ge=1, description="k completions per prompt")
    low: float = Field(0.0, ge=0, lt=1, description="keep rows whose pass rate is above this...")
    high: float = Field(1.0, gt=0, le=1, description="...and below this")
    template: str = "chat"

    @model_validator(mode="after")
    def _band(self):
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


class NoCotFilterConfig(SamplingFilterBase):
    kind: Literal["no_cot_filter"] = "no_cot_filter"
    tries: int = Field(8, ge=1, description="Kimi k1.5: N = 8")
    max_new_tokens: int = Field(32, ge=1)
    instruction: str = NO_COT_INSTRUCTION


class TraceFilterConfig(CurationBase):
    kind: Literal["trace_filter"] = "trace_filter"
    min_language_share: float = Field(0.95, ge=0, le=1)
    max_paragraph_words: int = Field(300, ge=1)
    max_repeated_share: float = Field(0.5, ge=0, le=1, description="share of repeated word 3-grams")
    code_in_math: bool = Field(False, description="allow ``` blocks in the thinking of math rows")
    check_answer: bool = Field(True, description="drop rows whose final answer differs from the thinking's")


CURATION_CONFIGS = {c.model_fields["kind"].default: c for c in (
    DecontaminateConfig, DedupConfig, DifficultyFilterConfig, NoCotFilterConfig, TraceFilterConfig)}


def partition(judged, describe) -> tuple[list[dict], list[dict]]:
    """(kept, removed) from (row, finding or None) pairs; `describe(finding)` is (reason, evidence)."""
    kept, removed = [], []
    for row, finding in judged:
        if finding:
            reason, evidence = describe(finding)
            removed.append({**row, "removed_reason": reason, "evidence": evidence})
        else:
            kept.append(row)
    return kept, removed


def select_rows(cfg, rows: list[dict], model_dir: str | None, eval_rows: list[dict] | None):
    """(kept, removed, extra report fields, measured pass rates or None) for one curation step."""
    if cfg.kind == "decontaminate":
        index = build_index(eval_rows, cfg.ngram)
        kept, removed = partition(decontaminate(rows, index, cfg.mode, cfg.threshold), lambda ev: ("contaminated", ev))
        return kept, removed, {"eval_items": index.size}, None
    if cfg.kind == "dedup":
        found = dedup(rows, cfg.near, cfg.threshold, cfg.num_perm, cfg.shingle)
        kept, removed = partition(found, lambda ev: (ev.pop("reason"), ev))
        return kept, removed, {}, None
    if cfg.kind == "trace_filter":
        rules = cfg.model_dump(include={"min_language_share", "max_paragraph_words", "max_repeated_share",
                                        "code_in_math", "check_answer"})
        kept, removed = partition(((row, trace_problem(row, **rules)) for row in rows), lambda problem: problem)
        return kept, removed, {}, None
    if cfg.kind == "difficulty_filter":
        return difficulty_filter(model_dir, rows, cfg.sampling(cfg.samples), cfg.low, cfg.high, cfg.template,
                                 cfg.generation.engine, cfg.generation.precision, cfg.trust_remote_code)
    kept, removed, extra = no_cot_filter(model_dir, rows, cfg.sampling(cfg.tries), cfg.instruction,
                                         cfg.generation.engine, cfg.generation.precision, cfg.trust_remote_code)
    return kept, removed, extra, None


def curate(cfg, rows: list[dict], out_dir, model_dir: str | None = None, eval_rows: list[dict] | None = None) -> dict:
    """Run one curation step on `rows` and write its outputs into `out_dir`; returns the report."""
    kept, removed, extra, rates = select_rows(cfg, rows, model_dir, eval_rows)
    return write_outputs(out_dir, cfg.kind, kept, removed, extra, rates)


def run(cfg, ctx) -> StageOutput:
    """The stage entry the worker calls (the registry maps every curation kind here)."""
    import json


    rows = load_stage_rows(ctx.input("data"), ctx)
    eval_rows = None
    if cfg.kind == "decontaminate":
        eval_rows = [r for s in cfg.eval_sets for r in load_rows(s.source, s.split, s.n, s.seed, s.params)]
    model_dir = ctx.input("model") if "model" in cfg.MODEL_FIELDS else None
    report = curate(cfg, rows, ctx.output_dir, model_dir, eval_rows)
    examples = json.loads((ctx.output_dir / "removed_examples.json").read_text())
    table = examples_table(examples)
    artifacts = ["report.json"] + (["pass_rates.png"] if (ctx.output_dir / "pass_rates.png").exists() else [])
    return StageOutput(outputs={"dataset": "kept.jsonl"}, metrics=report_metrics(report), artifacts=artifacts,
                       tables={"removed_examples.json": table} if table else {})
