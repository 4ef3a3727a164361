"""Stage kind `rejection_sample`: sample n completions per prompt from a model (usually the RL
stage's), keep only verified ones, and write them as an SFT-ready dataset.

DeepSeek-R1 stage 3 samples from the stage-2 checkpoint, keeps correct samples and drops chains of
thought with mixed languages, long paragraphs or code blocks; Kimi k1.5's long2short keeps the
shortest correct answer of n = 8. The rules are in data_curation/rejection.py. Outputs:
kept.jsonl (`dataset`: each row's prompt with the sampled completion as its `solution`),
removed.jsonl (every other sample with its reason), report.json (counts per reason, acceptance per
source and difficulty, throughput), an MLflow table of kept and removed examples, and a histogram
of the kept samples' thinking lengths.
"""

from __future__ import annotations

import time
from typing import ClassVar, Literal

from pydantic import Field

from data_curation.rejection import Sample, acceptance, select
from data_curation.report import examples_table, plot_histogram, report_metrics, write_outputs
from data_curation.trace_filter import TRACE_RULES
from stages.contracts import StageOutput
from stages.curation import SamplingFilterBase
from stages.runtime import load_stage_rows
from toolkit.core.templates import check_template, render_prompt
from toolkit.core.text import split_thinking
from toolkit.rewards.verifiers import score_rows
from toolkit.rollouts import load_tokenizer, rollout_completions

TraceRule = Literal[TRACE_RULES]


class RejectionSampleConfig(SamplingFilterBase):
    kind: Literal["rejection_sample"] = "rejection_sample"
    n: int = Field(4, ge=1, description="samples per prompt (Kimi's shortest rejection sampling: 8)")
    select: Literal["all_correct", "shortest_correct", "first_correct"] = "all_correct"
    max_per_prompt: int | None = Field(None, ge=1, description="kept samples per prompt; default: all for "
                                       "all_correct, 1 otherwise")
    temperature: float = Field(0.7, gt=0, description="ours; R1 does not state its sampling temperature")
    top_p: float = Field(0.95, gt=0, le=1)
    max_new_tokens: int = Field(512, ge=1)
    filters: list[TraceRule] = Field(default_factory=list, description="readability rules (trace_filter) the "
                                     "kept samples must pass; R1: mixed_language, long_paragraph, code_in_math")
    min_language_share: float = Field(0.95, ge=0, le=1)
    max_paragraph_words: int = Field(300, ge=1)
    max_repeated_share: float = Field(0.5, ge=0, le=1)
    require_thinking: bool = Field(True, description="keep only samples with a well-formed <think> block")
    template: str = "chat"
    after_think: bool = Field(True, description="math answers are read after </think> only")

    OUTPUTS: ClassVar[tuple[str, ...]] = ("dataset",)

    def semantic_errors(self) -> list[tuple[tuple, str]]:
        errors = super().semantic_errors()
        if msg := check_template(self.template):
            errors.append((("template",), msg))
        return errors


def sample_and_select(cfg: RejectionSampleConfig, model_dir: str, rows: list[dict]) -> tuple[list, list, dict]:
    """(kept rows, removed samples, report fields) for `rows`; the stage writes them out."""
    started = time.perf_counter()
    by_length = sorted(range(len(rows)), key=lambda i: len(str(rows[i]["prompt"])))  # less padding per batch
    ordered = [rows[i] for i in by_length]
    done = rollout_completions(model_dir, [render_prompt(cfg.template, r) for r in ordered], cfg.sampling(cfg.n),
                               cfg.generation.engine, cfg.generation.precision, cfg.trust_remote_code, progress=True)
    generated = time.perf_counter()
    flat_rows = [r for r in ordered for _ in range(cfg.n)]
    scores = score_rows(flat_rows, [c.text for cs in done for c in cs], after_think=cfg.after_think)
    rule_params = cfg.model_dump(include={"min_language_share", "max_paragraph_words", "max_repeated_share"})
    kept, removed = [], []
    for i, (row, completions) in enumerate(zip(ordered, done)):
        samples = [Sample(c.text, c.finished, c.tokens, scores[i * cfg.n + j]) for j, c in enumerate(completions)]
        k, r = select(row, samples, cfg.select, cfg.max_per_prompt, cfg.require_thinking, cfg.filters, rule_params)
        kept += k
        removed += r
    seconds = max(time.perf_counter() - started, 1e-9)
    report = {"prompts": len(rows), "samples_per_prompt": cfg.n, "select": cfg.select,
              "acceptance_rate": len(kept) / max(1, len(rows) * cfg.n),
              "prompts_with_kept": len({r["id"].rsplit("#rs", 1)[0] for r in kept}),
              "completions_per_s": len(rows) * cfg.n / seconds, "generation_share": (generated - started) / seconds,
              "seconds": seconds, **acceptance(rows, kept, cfg.n)}
    return kept, removed, report


def run(cfg: RejectionSampleConfig, ctx) -> StageOutput:
    import json

    model_dir = ctx.input("model")
    rows = load_stage_rows(ctx.input("data"), ctx)
    kept, removed, extra = sample_and_select(cfg, model_dir, rows)
    report = write_outputs(ctx.output_dir, cfg.kind, kept, removed, extra)
    tokenizer = load_tokenizer(model_dir, cfg.trust_remote_code)
    lengths = [len(tokenizer(split_thinking(r["solution"])[0] or "", add_special_tokens=False)["input_ids"])
               for r in kept]
    plot_histogram(lengths, ctx.output_dir / "thinking_lengths.png", "thinking length (tokens)", "kept samples",
                   f"{cfg.name}: {len(kept)} kept samples", bins=min(30, max(1, len(set(lengths)))))
    examples = json.loads((ctx.output_dir / "removed_examples.json").read_text())
    examples["kept"] = [{**r, "evidence": {"completion": r["solution"][:400], **r["sample"]}} for r in kept[:5]]
    metrics = {**report_metrics(report), "rs/thinking_tokens_mean": sum(lengths) / max(1, len(lengths))}
    return StageOutput(outputs={"dataset": "kept.jsonl"}, metrics=metrics,
                       artifacts=["report.json", "thinking_lengths.png"],
                       tables={"examples.json": examples_table(examples)})

