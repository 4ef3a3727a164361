"""`ifeval_constraints`: the fraction of a row's machine-checkable instructions a response obeys.

The row's `answer` is a JSON list of constraints, e.g.
    [{"type": "word_count", "min": 50, "max": 120}, {"type": "keywords", "words": ["tea"]},
     {"type": "json"}, {"type": "lowercase"}, {"type": "bullets", "count": 3}, {"type": "language", "language": "en"}]
Only the answer part (after </think>) is checked.
"""

from __future__ import annotations

import json
import re

from stages.core.language import consistency
from stages.core.text import split_thinking
from stages.rewards.base import Reward, completion_text


def _json_ok(text: str) -> bool:
    body = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    try:
        json.loads(body)
        return True
    except ValueError:
        return False


CHECKS = {
    "word_count": lambda t, c: c.get("min", 0) <= len(t.split()) <= c.get("max", 10**9),
    "keywords": lambda t, c: all(w.lower() in t.lower() for w in c["words"]),
    "forbidden_words": lambda t, c: not any(re.search(rf"\b{re.escape(w)}\b", t, re.I) for w in c["words"]),
    "json": lambda t, c: _json_ok(t),
    "lowercase": lambda t, c: t == t.lower() and any(ch.isalpha() for ch in t),
    "uppercase": lambda t, c: t == t.upper() and any(ch.isalpha() for ch in t),
    "bullets": lambda t, c: len(re.findall(r"^\s*[-*] ", t, re.M)) == c["count"],
    "language": lambda t, c: (consistency(t, c["language"]) or 0.0) >= c.get("min_share", 0.9),
    "ends_with": lambda t, c: t.rstrip().endswith(c["text"]),
}


def check_constraints(response: str, constraints: list[dict]) -> float:
    unknown = [c.get("type") for c in constraints if c.get("type") not in CHECKS]
    if unknown:
        raise ValueError(f"ifeval_constraints: unknown constraint types {unknown}; known: {sorted(CHECKS)}")
    if not constraints:
        return 1.0
    return sum(bool(CHECKS[c["type"]](response, c)) for c in constraints) / len(constraints)


class IfevalConstraints(Reward):
    name = "ifeval_constraints"

    def __init__(self):
        super().__init__("unjudged")

    def __call__(self, prompts=None, completions=(), answer=(), **_) -> list[float | None]:
        out: list[float | None] = []
        for c, spec in zip(completions, answer):
            if not spec:
                self.counters["unjudged"] += 1
                out.append(None)
                continue
            _, response = split_thinking(completion_text(c))
            out.append(check_constraints(response, json.loads(spec)))
        return out
