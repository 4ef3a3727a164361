"""DeepSeek-R1's language-consistency reward: the share of the thinking's words that are in the
target language (counted by script, toolkit.core.language)."""

from __future__ import annotations

from toolkit.core.language import LANGUAGE_SCRIPTS, consistency
from toolkit.core.text import split_thinking
from toolkit.rewards.base import Reward, completion_text


class LanguageConsistency(Reward):
    """Reward = consistency of the thinking (or the whole completion) with the target language,
    taken from the recipe (`language`) or else from the row's `language` column."""
    name = "language_consistency"

    def __init__(self, language: str | None = None, thinking_only: bool = True):
        super().__init__()
        if language is not None and language not in LANGUAGE_SCRIPTS:
            raise ValueError(f"language_consistency: unsupported language {language!r}")
        self.language, self.thinking_only = language, thinking_only

    def __call__(self, prompts=None, completions=(), **columns) -> list[float | None]:
        langs = columns.get("language") or [None] * len(completions)
        out = []
        for c, row_lang in zip(completions, langs):
            text = completion_text(c)
            if self.thinking_only:
                thinking, _ = split_thinking(text)
                text = thinking if thinking is not None else text
            out.append(consistency(text, self.language or row_lang or "en"))
        return out
