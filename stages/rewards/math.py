"""Math answer checking with math-verify.

Departures from peers, on purpose: the gold answer always goes first (`verify(gold, pred)` is not
symmetric), and a gold answer that cannot be parsed makes the sample unjudgeable (None) instead of
scoring 1.0. math-verify's own timeouts use signal.alarm, which fails outside the main thread, so
they are switched off here.
"""

from __future__ import annotations

import logging
import re

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

ANSWER_IS = re.compile(r"answer is[:\s]*\$?([^\n$]+?)\$?\s*\.?\s*$", re.IGNORECASE | re.MULTILINE)
# We enforce our own limits; silence its "timeout is disabled" notice on every call.
logging.getLogger("math_verify").setLevel(logging.ERROR)
ANY_FORM = [LatexExtractionConfig(), ExprExtractionConfig()]


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces matched, or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i:j - 1] if depth == 0 else None


def extract_answer(text: str, answer_is_fallback: bool = True) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if answer_is_fallback:
        matches = ANSWER_IS.findall(text)
        if matches:
            return matches[-1].strip()
    return None


def parse_gold(gold: str):
    """Parsed gold, or None when math-verify only got the raw string back (nothing it understood):
    comparing raw strings would let a broken gold score 1.0 against an identical broken answer."""
    gold = gold.replace("\\$", "").strip()  # currency: "\$5" is the number 5
    text = gold if ("\\boxed" in gold or "$" in gold) else f"${gold}$"
    parsed = parse(text, extraction_config=ANY_FORM, parsing_timeout=None)
    return parsed if any(not isinstance(p, str) for p in parsed) else None


def score_math(gold: str | None, completion: str, answer_is_fallback: bool = True) -> float | None:
    """1.0 / 0.0 for a judged sample; None when the gold answer itself is missing or unparseable."""
    if not gold:
        return None
    gold_parsed = parse_gold(str(gold))
    if gold_parsed is None:
        return None
    answer = extract_answer(completion, answer_is_fallback)
    if answer is None:
        return 0.0
    pred = parse(f"${answer}$", extraction_config=ANY_FORM, parsing_timeout=None)
    if not pred:
        return 0.0
    return 1.0 if verify(gold_parsed, pred, timeout_seconds=None) else 0.0


_POOLS: dict[tuple, object] = {}


def shared_pool(workers: int | None, timeout_s: float):
    """One scoring pool per (workers, timeout) and process, started on first use."""
    from stages.rewards.pool import ScoringPool

    key = (workers, timeout_s)
    if key not in _POOLS:
        _POOLS[key] = ScoringPool(score_math, workers=workers, timeout_s=timeout_s)
    return _POOLS[key]


def accuracy_math(answer_is_fallback: bool = True, timeout_s: float = 5.0, workers: int | None = None,
                  pooled: bool = True):
    """1.0 when the completion's final answer equals the gold `answer`, else 0.0; None if unjudgeable.

    With `pooled` (the default), samples are scored in worker processes with a hard per-sample
    timeout; a timed-out sample scores 0.0 and is counted in `reward.counters["timeouts"]`.
    """
    from stages.rewards import completion_text

    counters = {"timeouts": 0, "unjudged": 0}

    def reward(prompts=None, completions=(), answer=(), **_):
        items = [(g, completion_text(c), answer_is_fallback) for g, c in zip(answer, completions)]
        if pooled:
            pool = shared_pool(workers, timeout_s)
            before = pool.timeouts
            scores = pool.map(items, on_timeout=0.0, on_error=0.0)
            counters["timeouts"] += pool.timeouts - before
        else:
            scores = [score_math(*item) for item in items]
        counters["unjudged"] += sum(s is None for s in scores)
        return scores

    reward.counters = counters
    return reward
