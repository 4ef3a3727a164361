"""Stage kind `thinking_fusion` (Qwen3 stage 3): build the SFT set that teaches one model both
thinking and non-thinking modes, switched by /think and /no_think (data_curation/fusion.py says how
rows are laid out). The next stage is an `sft` on its `dataset`. Writes kept.jsonl, removed.jsonl
(rows without thinking or response), report.json with the composition actually produced, and a
table of example rows per mode.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from data_curation.fusion import CutAnswer, build_fusion
from data_curation.report import report_metrics, write_outputs
from stages.common import DataSpec, StageBase
from stages.contracts import StageOutput
from stages.runtime import load_stage_rows
from toolkit.core.thinking import STOP_THINKING


class ThinkingFusionConfig(StageBase):
    kind: Literal["thinking_fusion"] = "thinking_fusion"
    thinking: list[DataSpec] = Field(min_length=1, description="datasets whose solutions think, usually a "
                                     "rejection_sample stage's dataset")
    non_thinking: list[DataSpec] = Field(min_length=1, description="datasets whose solutions (thinking removed) "
                                         "are /no_think responses; include reasoning prompts, not only chat, or "
                                         "the model learns topic rather than flag")
    think_flag_share: float = Field(0.5, ge=0, le=1, description="thinking rows flagged /think; the rest carry "
                                    "no flag (thinking is the default). Ours: Qwen3 states no share")
    system_flag_share: float = Field(0.1, ge=0, le=1, description="flagged single-turn rows with the flag in "
                                     "the system message")
    multi_turn_share: float = Field(0.2, ge=0, le=1, description="rows preceded by an exchange with the "
                                    "opposite flag (the last flag governs)")
    cut_thinking_share: float = Field(0.0, ge=0, le=1, description="Ours, a departure (0 = the report): thinking "
                                      "rows added again with the thinking cut and closed by `stop_thinking`, as a "
                                      "budget does; the cut part trains without loss (data_curation/fusion.py)")
    cut_answer: CutAnswer = Field("response", description="Ours: what follows a cut row's stop-thinking "
                                  "string: the row's `response`, or the thought's unfinished equations and then "
                                  "the response (`working`; data_curation/fusion.py, `working_left`)")
    hard_switch_share: float = Field(0.0, ge=0, le=1, description="Ours, a departure (0 = the report): "
                                     "non-thinking rows added again without a flag, the empty think block (what "
                                     "`enable_thinking=False` renders, a budget of 0) trained without loss")
    stop_thinking: str = Field(STOP_THINKING, description="the string a cut row's thinking ends with: the "
                               "evaluation's (and `posttrain generate`'s) stop-thinking string")
    seed: int = 0

    OUTPUTS: ClassVar[tuple[str, ...]] = ("dataset",)

    @field_validator("thinking", "non_thinking", mode="before")
    @classmethod
    def _one_or_many(cls, value):
        return [value] if isinstance(value, (str, dict)) else value

    def data_inputs(self) -> dict[str, DataSpec]:
        return {f"{field}.{i}": spec for field in ("thinking", "non_thinking")
                for i, spec in enumerate(getattr(self, field))}


def run(cfg: ThinkingFusionConfig, ctx) -> StageOutput:
    loaded = {path: load_stage_rows(ctx.input(path), ctx) for path in cfg.data_inputs()}
    thinking = [r for path, rows in loaded.items() if path.startswith("thinking.") for r in rows]
    plain = [r for path, rows in loaded.items() if path.startswith("non_thinking.") for r in rows]
    rows, removed, composition = build_fusion(thinking, plain, cfg.think_flag_share, cfg.system_flag_share,
                                              cfg.multi_turn_share, cfg.seed, cfg.cut_thinking_share, cfg.stop_thinking,
                                              cfg.hard_switch_share, cfg.cut_answer)
    report = write_outputs(ctx.output_dir, cfg.kind, rows, removed, composition)
    examples = {mode: [r for r in rows if r["mode"] == mode][:4] for mode in ("think", "no_think")}
    table = {"mode": [], "prompt": [], "solution": []}
    for mode, rs in examples.items():
        for r in rs:
            table["mode"].append(mode)
            table["prompt"].append(" | ".join(f"{m['role']}: {m['content']}" for m in r["prompt"])[:400])
            table["solution"].append(r["solution"][:400])
    metrics = {k.replace("curate/", "fusion/"): v for k, v in report_metrics(report).items()}
    return StageOutput(outputs={"dataset": "kept.jsonl"}, metrics=metrics, artifacts=["report.json"],
                       tables={"examples.json": table})
