"""Quality rules for SFT traces (cold start, rejection sampling), after DeepSeek-R1: drop chains of
thought with mixed languages, long paragraphs or code blocks (in math), heavy repetition, or a final
answer that disagrees with the answer the thinking reached. Each rule is a pure function of the
row; the first rule that fails names the reason."""

from __future__ import annotations

import re
from collections.abc import Collection

from toolkit.core.language import consistency
from toolkit.core.text import extract_answer, split_thinking

FENCE = re.compile(r"```")
LAST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def repeated_share(text: str, n: int = 3) -> float:
    words = text.lower().split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def thinking_conclusion(thinking: str) -> str | None:
    """The answer a chain of thought reached: its last \\boxed{}, else its last number."""
    boxed = extract_answer(thinking, answer_is_fallback=False)
    if boxed is not None:
        return boxed
    numbers = LAST_NUMBER.findall(thinking)
    return numbers[-1] if numbers else None


def same_answer(a: str, b: str) -> bool:
    norm = lambda s: s.replace(" ", "").replace("$", "").rstrip(".").lower()
    if norm(a) == norm(b):
        return True
    try:
        return abs(float(eval_fraction(a)) - float(eval_fraction(b))) < 1e-9
    except (ValueError, ZeroDivisionError):
        return False


def eval_fraction(s: str) -> float:
    s = s.strip().replace(",", "")
    if "/" in s:
        num, den = s.split("/", 1)
        return float(num) / float(den)
    return float(s)


# The rules by name, in the order they are checked (a missing think block is always a problem).
TRACE_RULES = ("mixed_language", "long_paragraph", "code_in_math", "repetition", "answer_disagrees")


def trace_problem(row: dict, *, min_language_share: float = 0.95, max_paragraph_words: int = 300,
                  max_repeated_share: float = 0.5, code_in_math: bool = False,
                  check_answer: bool = True, rules: Collection[str] = TRACE_RULES) -> tuple[str, str] | None:
    """(reason, evidence) for the first rule in `rules` the row's `solution` breaks, or None."""
    text = row.get("solution") or ""
    thinking, answer = split_thinking(text)
    if thinking is None:
        return "no_thinking", text[:120]
    share = consistency(thinking, row.get("language") or "en")
    if "mixed_language" in rules and share is not None and share < min_language_share:
        return "mixed_language", f"{share:.2f} of the thinking's words in {row.get('language') or 'en'}"
    longest = max((len(p.split()) for p in re.split(r"\n\s*\n", thinking)), default=0)
    if "long_paragraph" in rules and longest > max_paragraph_words:
        return "long_paragraph", f"a paragraph of {longest} words"
    if "code_in_math" in rules and not code_in_math and row.get("verifier") == "math" and FENCE.search(thinking):
        return "code_in_math", "a ``` block in the thinking"
    repeated = repeated_share(thinking)
    if "repetition" in rules and repeated > max_repeated_share:
        return "repetition", f"{repeated:.2f} of the word 3-grams repeat"
    if check_answer and "answer_disagrees" in rules:
        reached, final = thinking_conclusion(thinking), extract_answer(answer)
        if reached is not None and final is not None and not same_answer(reached, final):
            return "answer_disagrees", f"thinking reached {reached!r}, answer says {final!r}"
    return None
