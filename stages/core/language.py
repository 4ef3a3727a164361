"""DeepSeek-R1's language-consistency reward: the share of the thinking's words that are in the
target language.

Words are counted by script, since a dictionary per language is more than a reward needs: a run of
Latin letters is one word, each CJK ideograph or kana is one word (those scripts put no spaces
between words), a run of Hangul is one word, a run of Cyrillic (or Greek, Arabic, ...) letters is
one word. Code blocks, inline code, LaTeX commands and math, numbers and single-letter variables
are neutral: not counted at all. Departure from the paper: languages that share a script (English
and French, say) are not told apart.
"""

from __future__ import annotations

import re

SCRIPTS = {
    "latin": r"[A-Za-z\u00C0-\u024F]{2,}",
    "han": r"[\u3400-\u4DBF\u4E00-\u9FFF\uF900-\uFAFF]",
    "kana": r"[\u3040-\u30FF]",
    "hangul": r"[\uAC00-\uD7AF\u1100-\u11FF]+",
    "cyrillic": r"[\u0400-\u04FF]{2,}",
    "greek": r"[\u0370-\u03FF]{2,}",
    "arabic": r"[\u0600-\u06FF]{2,}",
    "devanagari": r"[\u0900-\u097F]+",
}
WORD = re.compile("|".join(f"(?P<{name}>{pattern})" for name, pattern in SCRIPTS.items()))
LANGUAGE_SCRIPTS = {
    "en": {"latin"}, "fr": {"latin"}, "de": {"latin"}, "es": {"latin"}, "it": {"latin"}, "pt": {"latin"},
    "zh": {"han"}, "ja": {"han", "kana"}, "ko": {"hangul", "han"}, "ru": {"cyrillic"}, "uk": {"cyrillic"},
    "el": {"greek"}, "ar": {"arabic"}, "hi": {"devanagari"},
}
NEUTRAL = [
    re.compile(r"```.*?(```|$)", re.DOTALL),  # fenced code, closed or not
    re.compile(r"`[^`\n]*`"),  # inline code
    re.compile(r"\$\$.*?\$\$|\$[^$\n]*\$|\\\(.*?\\\)|\\\[.*?\\\]", re.DOTALL),  # math
    re.compile(r"\\[A-Za-z]+"),  # stray LaTeX commands such as \frac outside $...$
    re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\([^)]*\)", re.ASCII),  # calls like f(x) or print(a)
    # identifiers with digits or underscores, and numbers: ASCII only, so the digits in
    # "我们有3个苹果" are dropped but the Han characters around them still count
    re.compile(r"\b[A-Za-z0-9_]*[_0-9][A-Za-z0-9_]*\b", re.ASCII),
]


def script_counts(text: str) -> dict[str, int]:
    for pattern in NEUTRAL:
        text = pattern.sub(" ", text)
    counts: dict[str, int] = {}
    for m in WORD.finditer(text):
        counts[m.lastgroup] = counts.get(m.lastgroup, 0) + 1
    return counts


def consistency(text: str, language: str) -> float | None:
    """Share of counted words written in `language`'s script(s); None when there are no words."""
    scripts = LANGUAGE_SCRIPTS.get(language)
    if scripts is None:
        raise ValueError(f"language_consistency: unsupported language {language!r}; supported: {sorted(LANGUAGE_SCRIPTS)}")
    counts = script_counts(text)
    total = sum(counts.values())
    if total == 0:
        return None
    return sum(n for s, n in counts.items() if s in scripts) / total
