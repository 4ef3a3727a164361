"""Stage kind `preference_pairs`: preference rows for reward models and DPO (data_curation/preferences.py).

- `mode: quality` / `long2short`: sample `n` completions per prompt from `model`, judge each with
  the row's verifier and the readability rules, and pair them (chosen = correct, finished,
  language-consistent; long2short: the shortest correct against wrong and >= 1.5x longer ones).
- `mode: corrupted_answer`: no model; chosen = the row's reference solution, rejected = the same
  solution with its final boxed answer replaced by a wrong one (correct against wrong sums).
- `mode: padded_thinking`: no model; chosen = the reference solution, rejected = the same answer
  after a thinking block padded with `padding` re-checks of its own lines (concise against
  verbose: the long2short preference). Both synthetic modes check that a reward model or DPO learns.
Writes pairs.jsonl (its `pairs` output), report.json (pairs, prompts with pairs, reasons), and a
table of example pairs.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from data_curation.preferences import make_pair, pairs_from_samples
from data_curation.rejection import Sample
from data_curation.report import write_jsonl
from stages.contracts import StageOutput
from stages.curation import SamplingFilterBase
from stages.runtime import load_stage_rows
from toolkit.core.files import write_json_atomic
from toolkit.core.templates import render_prompt
from toolkit.core.text import split_thinking
from toolkit.core.thinking import rechecked, thinking_response
from toolkit.rewards.verifiers import score_rows
from toolkit.rollouts import rollout_completions

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class PreferencePairsConfig(SamplingFilterBase):
    kind: Literal["preference_pairs"] = "preference_pairs"
    model: str | None = Field(None, description="the model that samples (quality / long2short)")
    mode: Literal["quality", "long2short", "corrupted_answer", "padded_thinking"] = "quality"
    padding: int = Field(3, ge=1, description="padded_thinking: times the thinking is re-checked")
    n: int = Field(8, ge=2, description="samples per prompt (Kimi's long2short: 8)")
    length_ratio: float = Field(1.5, gt=1, description="long2short: correct samples this much longer are negatives")
    max_pairs: int | None = Field(4, ge=1, description="pairs per prompt")
    temperature: float = Field(1.0, gt=0)
    template: str = "chat"
    seed: int = 0

    OUTPUTS: ClassVar[tuple[str, ...]] = ("pairs",)

    @model_validator(mode="after")
    def _model_for_sampling(self):
        if self.mode in ("quality", "long2short") and self.model is None:
            raise ValueError(f"mode {self.mode} samples from a model: set `model`")
        return self


def corrupted_pairs(rows: list[dict], seed: int = 0) -> list[dict]:
    """Reference solution against the same text with a wrong final answer (rows without a boxed
    integer answer are skipped)."""
    rng = random.Random(seed)
    pairs = []
    for row in rows:
        solution = row.get("solution") or ""
        found = BOXED.findall(solution)
        if not found or not found[-1].lstrip("-").isdigit():
            continue
        wrong = str(int(found[-1]) + rng.choice([-3, -2, -1, 1, 2, 3]))
        head, _, tail = solution.rpartition(f"\\boxed{{{found[-1]}}}")
        pairs.append(make_pair(row, 0, solution, f"{head}\\boxed{{{wrong}}}{tail}", "correct vs wrong answer"))
    return pairs


def padded_pairs(rows: list[dict], padding: int = 3) -> list[dict]:
    """Reference solution against the same answer after padded thinking (rows without a think block
    are skipped)."""
    pairs = []
    for row in rows:
        thinking, answer = split_thinking(row.get("solution") or "")
        if not thinking:
            continue
        pairs.append(make_pair(row, 0, row["solution"], thinking_response(rechecked(thinking, padding), answer),
                               "concise vs padded thinking"))
    return pairs


def run(cfg: PreferencePairsConfig, ctx) -> StageOutput:
    rows = load_stage_rows(ctx.input("data"), ctx)
    if cfg.mode == "corrupted_answer":
        pairs = corrupted_pairs(rows, cfg.seed)
    elif cfg.mode == "padded_thinking":
        pairs = padded_pairs(rows, cfg.padding)
    else:
        done = rollout_completions(ctx.input("model"), [render_prompt(cfg.template, r) for r in rows],
                                   cfg.sampling(cfg.n), cfg.generation.engine, cfg.generation.precision,
                                   cfg.trust_remote_code, progress=True)
        flat = score_rows([r for r in rows for _ in range(cfg.n)], [c.text for cs in done for c in cs],
                          after_think=True)
        pairs = []
        for i, (row, completions) in enumerate(zip(rows, done)):
            samples = [Sample(c.text, c.finished, c.tokens, flat[i * cfg.n + j]) for j, c in enumerate(completions)]
            pairs += pairs_from_samples(row, samples, cfg.mode, cfg.length_ratio, cfg.max_pairs)
    if not pairs:
        raise RuntimeError(f"{cfg.name}: no preference pairs from {len(rows)} prompts (mode {cfg.mode}); a "
                           "prompt needs both a chosen and a rejected sample")
    reasons = Counter("longer" if p["reason"].endswith("x longer") else p["reason"].split(" vs ")[-1]
                      for p in pairs)
    report = {"prompts": len(rows), "pairs": len(pairs), "prompts_with_pairs": len({p["id"].rsplit("#p", 1)[0]
                                                                                     for p in pairs}),
              "rejected_because": dict(sorted(reasons.items()))}
    write_jsonl(ctx.output_dir / "pairs.jsonl", pairs)
    write_json_atomic(ctx.output_dir / "report.json", report)
    table = {k: [str(p[k])[:300] for p in pairs[:8]] for k in ("reason", "chosen", "rejected")}
    metrics = {"pairs/count": float(len(pairs)), "pairs/prompts_with_pairs": float(report["prompts_with_pairs"]),
               **{f"pairs/rejected/{k}": float(v) for k, v in reasons.items()}}
    return StageOutput(outputs={"pairs": "pairs.jsonl"}, metrics=metrics, artifacts=["report.json"],
                       tables={"pair_examples.json": table})
