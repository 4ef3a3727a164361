"""Filters that sample from a model and score the samples with each row's verifier.

- difficulty: pass rate over k samples; keep rows with low < rate < high (drop the always- and
  never-solved by default; open-r1's DAPO filter: k = 8, temperature 1.0, 0.1 < p < 0.6). The rate
  is written into each kept row as `pass_rate`, for curriculum and prioritized sampling later.
- no_cot (Kimi k1.5, Qwen3): ask for the bare answer without reasoning, N tries (Kimi: 8); a prompt
  answered correctly in any try is guessable and goes. The instruction asks for \boxed{}, and a
  short bare reply ("19") is read as the answer too, since that is what a model asked for no
  reasoning most often writes.
Rows whose verifier is "none" cannot be scored and pass through untouched (counted as unverifiable).
"""

from __future__ import annotations

import time

from toolkit.core.templates import render_prompt, with_instruction
from toolkit.rewards.verifiers import score_rows
from toolkit.rollouts import SamplingSpec, rollout

NO_COT_INSTRUCTION = ("Answer with only the final answer in \\boxed{}, without any reasoning or explanation.")


def _sample_and_score(model_dir: str, rows: list[dict], prompts: list, spec: SamplingSpec, engine: str,
                      precision: str, trust_remote_code: bool, **math_options) -> tuple[list[list[float | None]], dict]:
    started = time.perf_counter()
    completions = rollout(model_dir, prompts, spec, engine, precision, trust_remote_code, progress=True)
    generated = time.perf_counter()
    flat_rows = [r for r in rows for _ in range(spec.n)]
    flat = score_rows(flat_rows, [c for cs in completions for c in cs], **math_options)
    done = time.perf_counter()
    scores = [flat[i * spec.n:(i + 1) * spec.n] for i in range(len(rows))]
    total = max(done - started, 1e-9)
    return scores, {"prompts_per_s": len(rows) / total, "generation_share": (generated - started) / total,
                    "seconds": total}


def difficulty_filter(model_dir: str, rows: list[dict], spec: SamplingSpec, low: float, high: float,
                      template: str = "chat", engine: str = "auto", precision: str = "float32",
                      trust_remote_code: bool = False):
    """(kept rows with pass_rate, removed rows with reason/evidence, timing, measured rates)."""
    judged = [r for r in rows if r["verifier"] != "none"]
    scores, timing = _sample_and_score(model_dir, judged, [render_prompt(template, r) for r in judged], spec,
                                       engine, precision, trust_remote_code)
    kept, removed, rates = [r for r in rows if r["verifier"] == "none"], [], []
    for row, s in zip(judged, scores):
        values = [v for v in s if v is not None]
        if not values:
            removed.append({**row, "removed_reason": "unjudgeable", "evidence": {"samples": spec.n}})
            continue
        rate = sum(values) / len(values)
        rates.append(rate)
        if rate <= low:
            removed.append({**row, "removed_reason": "too_hard", "evidence": {"pass_rate": rate, "low": low}})
        elif rate >= high:
            removed.append({**row, "removed_reason": "too_easy", "evidence": {"pass_rate": rate, "high": high}})
        else:
            kept.append({**row, "pass_rate": rate})
    timing["unverifiable_passed_through"] = len(rows) - len(judged)
    return kept, removed, timing, rates


def no_cot_prompt(row: dict, instruction: str) -> list[dict]:
    return with_instruction(row["prompt"], instruction)


def no_cot_filter(model_dir: str, rows: list[dict], spec: SamplingSpec, instruction: str = NO_COT_INSTRUCTION,
                  engine: str = "auto", precision: str = "float32", trust_remote_code: bool = False):
    """(kept rows, removed rows with reason/evidence, timing)."""
    judged = [r for r in rows if r["verifier"] != "none"]
    scores, timing = _sample_and_score(model_dir, judged, [no_cot_prompt(r, instruction) for r in judged], spec,
                                       engine, precision, trust_remote_code, bare_answer=True)
    kept, removed = [r for r in rows if r["verifier"] == "none"], []
    for row, s in zip(judged, scores):
        hits = sum(1 for v in s if v is not None and v >= 1.0)
        if hits:
            removed.append({**row, "removed_reason": "guessable_without_cot",
                            "evidence": {"correct_tries": hits, "tries": spec.n}})
        else:
            kept.append(row)
    timing["unverifiable_passed_through"] = len(rows) - len(judged)
    return kept, removed, timing
