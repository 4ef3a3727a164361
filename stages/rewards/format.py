"""Format rewards: DeepSeek-R1's reasoning-in-<think> layout and R1-Zero's <answer> tag style
(`format_think`, all or nothing), and a tag count with partial credit (`format_tags`) for shaping
early RL on small models: each of <think>, </think> and, with answer tags, <answer>, </answer>
that appears exactly once earns its share."""

from __future__ import annotations

import re

from stages.rewards.base import Reward, completion_text

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


class FormatThink(Reward):
    name = "format_think"
    accuracy = True  # a template-shaped answer must earn it, or the recipe's format reward is unreachable

    def __init__(self, answer_tags: bool = False):
        super().__init__()
        self.answer_tags = answer_tags

    def __call__(self, prompts=None, completions=(), **_) -> list[float | None]:
        return [1.0 if is_well_formed(completion_text(c), self.answer_tags) else 0.0 for c in completions]


class FormatTags(Reward):
    name = "format_tags"
    accuracy = True

    def __init__(self, answer_tags: bool = False):
        super().__init__()
        self.tags_counted = ["<think>", "</think>"] + (["<answer>", "</answer>"] if answer_tags else [])

    def __call__(self, prompts=None, completions=(), **_) -> list[float | None]:
        share = 1.0 / len(self.tags_counted)
        return [float(sum(share for tag in self.tags_counted if completion_text(c).count(tag) == 1)) for c in completions]
