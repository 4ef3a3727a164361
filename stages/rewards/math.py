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
    text = gold if ("\\boxed" in gold or "$" in gold) else f"${gold}$"
    parsed = parse(text, extraction_config=ANY_FORM, parsing_timeout=None)
    return parsed or None


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


def accuracy_math(answer_is_fallback: bool = True):
    from stages.rewards import completion_text

    def reward(prompts=None, completions=(), answer=(), **_):
        return [score_math(g, completion_text(c), answer_is_fallback) for g, c in zip(answer, completions)]
    return reward
