"""Rejection sampling (DeepSeek-R1 stage 3; Kimi k1.5's shortest rejection sampling): which of a
prompt's sampled completions become SFT rows.

Every sample ends up in exactly one place: kept, or removed with one reason, checked in this order:
  truncated       no end-of-turn token (cut by the token limit), or a think block never closed
  unjudgeable     the row's verifier cannot score it (verifier "none", unparseable gold)
  wrong           verified score below 1 (code: not every test passes)
  no_thinking     `require_thinking` and no well-formed <think> block
  filtered:<rule> a readability rule of data_curation.trace_filter (R1: mixed_language,
                  long_paragraph, code_in_math; Qwen3: repetition, answer_disagrees)
  not_selected    correct and readable, but `select` / `max_per_prompt` chose other samples
`select`: all_correct (every survivor, up to max_per_prompt), first_correct (the first
max_per_prompt, default 1, in sampling order), shortest_correct (the max_per_prompt shortest in
tokens, default 1: Kimi's long2short).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

from data_curation.trace_filter import trace_problem
from toolkit.core.text import split_thinking

SELECTIONS = ("all_correct", "shortest_correct", "first_correct")


@dataclass
class Sample:
    text: str
    finished: bool  # ended with the end-of-turn token
    tokens: int
    score: float | None


def judge(row: dict, sample: Sample, require_thinking: bool = True, rules: Collection[str] = (),
          rule_params: dict | None = None) -> tuple[str, dict] | None:
    """(reason, evidence) for why a sample cannot be kept, or None when it is verified and readable."""
    text = sample.text
    if not sample.finished:
        return "truncated", {"why": "no end of turn", "tokens": sample.tokens}
    if text.count("<think>") > text.count("</think>"):
        return "truncated", {"why": "thinking never closed", "tokens": sample.tokens}
    if sample.score is None:
        return "unjudgeable", {"verifier": row["verifier"]}
    if sample.score < 1.0:
        return "wrong", {"score": sample.score}
    if require_thinking and split_thinking(text)[0] is None:
        return "no_thinking", {"start": text[:80]}
    if rules and (problem := trace_problem({**row, "solution": text}, rules=rules, **(rule_params or {}))):
        reason, evidence = problem
        return ("no_thinking" if reason == "no_thinking" else f"filtered:{reason}"), {"detail": evidence}
    return None


def select(row: dict, samples: list[Sample], how: str = "all_correct", max_per_prompt: int | None = None,
           require_thinking: bool = True, rules: Collection[str] = (),
           rule_params: dict | None = None) -> tuple[list[dict], list[dict]]:
    """(kept SFT rows, removed samples with reason and evidence) for one prompt's samples."""
    if how not in SELECTIONS:
        raise ValueError(f"unknown select {how!r}; expected one of {SELECTIONS}")
    verdicts = [judge(row, s, require_thinking, rules, rule_params) for s in samples]
    survivors = [j for j, v in enumerate(verdicts) if v is None]
    if how == "shortest_correct":
        survivors.sort(key=lambda j: (samples[j].tokens, j))
    cap = max_per_prompt if max_per_prompt is not None else (None if how == "all_correct" else 1)
    chosen = set(survivors[:cap] if cap is not None else survivors)
    kept, removed = [], []
    for j, (s, verdict) in enumerate(zip(samples, verdicts)):
        if j in chosen:
            kept.append({**row, "id": f"{row['id']}#rs{j}", "solution": s.text,
                         "sample": {"index": j, "tokens": s.tokens, "score": s.score}})
            continue
        reason, evidence = verdict or ("not_selected", {"select": how, "tokens": s.tokens})
        removed.append({**row, "removed_reason": reason,
                        "evidence": {**evidence, "sample": j, "completion": s.text[:400]}})
    return kept, removed


def acceptance(rows: list[dict], kept: list[dict], samples_per_prompt: int) -> dict:
    """Acceptance rate (kept samples / sampled) and prompts with at least one kept sample, per
    source and per difficulty."""
    kept_by_id = defaultdict(int)
    for r in kept:
        kept_by_id[r["id"].rsplit("#rs", 1)[0]] += 1
    out: dict[str, dict] = {"by_source": {}, "by_difficulty": {}}
    for key, field in (("by_source", "source"), ("by_difficulty", "difficulty")):
        groups = defaultdict(list)
        for r in rows:
            groups[str(r[field])].append(kept_by_id[r["id"]])
        out[key] = {g: {"prompts": len(ks), "samples": len(ks) * samples_per_prompt, "kept": sum(ks),
                        "acceptance": sum(ks) / (len(ks) * samples_per_prompt),
                        "prompts_with_kept": sum(1 for k in ks if k)} for g, ks in sorted(groups.items())}
    return out
