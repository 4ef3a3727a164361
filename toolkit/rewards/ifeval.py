"""`ifeval_constraints`: the fraction of a row's machine-checkable instructions a response obeys.

The row's `answer` is a JSON list of constraints, e.g.
    [{"type": "word_count", "min": 50, "max": 120}, {"type": "keywords", "words": ["tea"]},
     {"type": "json"}, {"type": "lowercase"}, {"type": "bullets", "count": 3}, {"type": "language", "language": "en"}]
Only the answer is checked: the text after the one closed thinking block when the completion has
thinking tags (the whole text when it has none). With the tags out of order (a stray second
`</think>`) or the thinking unclosed there is no answer, and the row scores 0: checked as the whole
text, a stray tag let the thinking count toward the constraints, and in qwen3's general RL on demo
"- a\n- b\n- c\n\n</think>\n\ni hope this helps." was paid in full (the seventeenth run's /no_think
break, RESULTS.md).
"""

from __future__ import annotations

import json
import re
import unicodedata

from toolkit.core.language import consistency
from toolkit.core.text import answer_region
from toolkit.rewards.base import Reward, completion_text

# Letters of other scripts that look like Latin ones (Unicode's confusables for Cyrillic and Greek,
# the ones a word can be spelled with). With NFKC (fullwidth, ligatures) and format characters
# (zero-width spaces) removed, `tеa` with a Cyrillic `е` reads as the forbidden `tea` it shows.
CONFUSABLES = str.maketrans(
    "аеорсухіјѕԁԛԝһкмнтвАВЕКМНОРСТХІЈЅαονρτυχκιΑΒΕΖΗΙΚΜΝΟΡΤΥΧıɑ",
    "aeopcyxijsdqwhkmhtbABEKMHOPCTXIJSaovptuxkiABEZHIKMNOPTYXia")
CASED_SHARE = 0.8  # lowercase/uppercase: letters that have a case must be most of the letters


def skeleton(text: str) -> str:
    text = "".join(ch for ch in unicodedata.normalize("NFKC", text) if unicodedata.category(ch) != "Cf")
    return text.translate(CONFUSABLES)


def has_word(text: str, word: str) -> bool:
    """`word` as a whole word (`cat` is not in `concatenate`); scripts without spaces between words
    (Chinese, Japanese) can only be matched as substrings."""
    if not word.isascii():
        return word.lower() in text.lower()
    return re.search(rf"(?<![^\W_]){re.escape(word)}(?![^\W_])", text, re.IGNORECASE) is not None


def _json_ok(text: str) -> bool:
    """A JSON object or array (a bare quoted string or number is not what "answer in JSON" asks)."""
    body = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    try:
        return isinstance(json.loads(body), (dict, list))
    except ValueError:
        return False


def _in_case(text: str, lower: bool) -> bool:
    """All in one case, and written mostly in letters that have case: `中文回答` is neither."""
    letters = [ch for ch in text if ch.isalpha()]
    cased = [ch for ch in letters if ch.lower() != ch.upper()]
    return (bool(cased) and len(cased) >= CASED_SHARE * len(letters)
            and text == (text.lower() if lower else text.upper()))


CHECKS = {
    "word_count": lambda t, c: c.get("min", 0) <= len(t.split()) <= c.get("max", 10**9),
    "keywords": lambda t, c: all(has_word(t, w) for w in c["words"]),
    "forbidden_words": lambda t, c: not any(has_word(skeleton(t), skeleton(w)) for w in c["words"]),
    "json": lambda t, c: _json_ok(t),
    "lowercase": lambda t, c: _in_case(t, lower=True),
    "uppercase": lambda t, c: _in_case(t, lower=False),
    "bullets": lambda t, c: len(re.findall(r"^\s*[-*] ", t, re.M)) == c["count"],
    "language": lambda t, c: (consistency(t, c["language"]) or 0.0) >= c.get("min_share", 0.9),
    "ends_with": lambda t, c: t.rstrip().endswith(c["text"]),
}


def check_constraints(response: str | None, constraints: list[dict]) -> float | None:
    """The share of constraints the response obeys; None for an empty list (nothing to judge); 0 for
    no response (no answer where the template puts it). Unknown types are refused either way."""
    unknown = [c.get("type") for c in constraints if c.get("type") not in CHECKS]
    if unknown:
        raise ValueError(f"ifeval_constraints: unknown constraint types {unknown}; known: {sorted(CHECKS)}")
    if not constraints:
        return None
    if response is None:
        return 0.0
    return sum(bool(CHECKS[c["type"]](response, c)) for c in constraints) / len(constraints)


class IfevalConstraints(Reward):
    name = "ifeval_constraints"

    def __init__(self):
        super().__init__("unjudged", "no_answer")

    def __call__(self, prompts=None, completions=(), answer=(), **_) -> list[float | None]:
        out: list[float | None] = []
        for c, spec in zip(completions, answer):
            response = answer_region(completion_text(c), after_think=None)  # None: unclosed, tags out of order
            value = check_constraints(response.strip() if response is not None else None,
                                      json.loads(spec) if spec else [])
            self.counters["no_answer"] += response is None and value is not None
            self.counters["unjudged"] += value is None
            out.append(value)
        return out
