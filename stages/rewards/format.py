"""Format rewards: DeepSeek-R1's reasoning-in-<think> layout, and R1-Zero's <answer> tag style."""

from __future__ import annotations

import re

THINK_THEN_ANSWER = re.compile(r"^\s*<think>(.*?)</think>\s*(\S.*)$", re.DOTALL)
THINK_AND_ANSWER_TAGS = re.compile(r"^\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*$", re.DOTALL)


def split_thinking(text: str) -> tuple[str | None, str]:
    """(thinking, answer) of a completion; thinking is None when there is no well-formed block."""
    m = THINK_THEN_ANSWER.match(text)
    if not m or text.count("<think>") != 1 or text.count("</think>") != 1:
        return None, text
    return m.group(1).strip(), m.group(2).strip()


def is_well_formed(text: str, answer_tags: bool = False) -> bool:
    if text.count("<think>") != 1 or text.count("</think>") != 1:
        return False
    if answer_tags:
        m = THINK_AND_ANSWER_TAGS.match(text)
        return bool(m and m.group(2).strip() and text.count("<answer>") == 1)
    return split_thinking(text)[0] is not None


def format_think(answer_tags: bool = False):
    from stages.rewards import completion_text

    def reward(prompts=None, completions=(), **_):
        return [1.0 if is_well_formed(completion_text(c), answer_tags) else 0.0 for c in completions]
    return reward
