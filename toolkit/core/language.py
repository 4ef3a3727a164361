"""DeepSeek-R1's language-consistency reward: the share of the thinking's words that are in the
target language.

Words are counted by script, since a dictionary per language is more than a reward needs: a run of
Latin letters is one word, each CJK ideograph or kana is one word (those scripts put no spaces
between words), a run of Hangul is one word, a run of Cyrillic (or Greek, Arabic, ...) letters is
one word. Departure from the paper: languages that share a script (English and French, say) are
not told apart.

Code and mathematics are neutral, but only where they really are code or mathematics, since a
policy will hide its reasoning wherever the counter does not look. A span is neutral when it is
CLOSED (a fenced block, an inline code span, `$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]`, a call
`name(args)` on one line, or a known LaTeX command such as `\\frac`), SMALL (at most MAX_SPAN
characters inside; longer, it is not skipped), and holds no run of three or more space-separated
words (prose). Inside a neutral span only ASCII is skipped: Chinese in a code comment still counts.
Neutral spans may cover at most half of the text; past that, they count. Unknown `\\word` commands
and identifiers outside spans count as words. The scan is linear: each opener looks at most
MAX_SPAN characters ahead.
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
# opener -> (closer, the most characters between them, whether a newline may stand between them)
CLOSERS = {"```": ("```", 2000, True), "`": ("`", 80, False), "$$": ("$$", 300, True), "$": ("$", 200, False),
           "\\(": ("\\)", 300, True), "\\[": ("\\]", 300, True), "(": (")", 60, False)}
OPENER = re.compile(r"```|`|\$\$|\$|\\\(|\\\[|(?<![A-Za-z0-9_])[A-Za-z_][A-Za-z0-9_]{0,30}\(|\\[A-Za-z]+")
LATEX_COMMANDS = frozenset(
    "frac dfrac tfrac sqrt times cdot div pm mp leq geq le ge neq ne approx equiv sim propto infty sum prod int "
    "lim log ln exp sin cos tan sec csc cot arcsin arccos arctan pi alpha beta gamma delta epsilon theta lambda mu "
    "sigma phi omega Delta Sigma Omega left right quad qquad boxed ldots cdots dots binom choose mod pmod bmod "
    "mathbb mathrm mathbf overline underline hat bar vec angle circ degree perp parallel cup cap subset subseteq "
    "in notin forall exists to rightarrow Rightarrow implies iff begin end cases align aligned".split())
PROSE = re.compile(r"[^\W\d_]{2,}(?:\s+[^\W\d_]{2,}){2,}")
ASCII = re.compile(r"[\x00-\x7f]+")
NEUTRAL_SHARE = 0.5


def neutral_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each closed, small, prose-free code or math span, in order."""
    spans, i = [], 0
    while m := OPENER.search(text, i):
        token = m.group()
        if token.startswith("\\") and token not in CLOSERS:  # a LaTeX command: neutral when known
            if token[1:] in LATEX_COMMANDS:
                spans.append(m.span())
            i = m.end()
            continue
        closer, limit, multiline = CLOSERS["(" if token.endswith("(") and token not in CLOSERS else token]
        end = text.find(closer, m.end(), m.end() + limit + len(closer))
        body = text[m.end():end]
        if end < 0 or (not multiline and "\n" in body) or PROSE.search(body):
            i = m.end()
            continue
        spans.append((m.start(), end + len(closer)))
        i = end + len(closer)
    return spans


def counted_text(text: str) -> str:
    """The text as the counter reads it: neutral spans reduced to what they hold beyond ASCII, up to
    NEUTRAL_SHARE of the text; the rest as written."""
    pieces, last, budget = [], 0, NEUTRAL_SHARE * len(text)
    for start, end in neutral_spans(text):
        budget -= end - start
        if budget < 0:
            break
        pieces += [text[last:start], " ", ASCII.sub(" ", text[start:end]), " "]
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def script_counts(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in WORD.finditer(counted_text(text)):
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
