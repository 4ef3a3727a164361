"""Format rewards: DeepSeek-R1's reasoning-in-<think> layout and R1-Zero's <answer> tag style
(`format_think`, all or nothing), and a tag count with partial credit (`format_tags`) for shaping
early RL on small models: each of <think>, </think> and, with answer tags, <answer>, </answer>
that appears exactly once earns its share."""

from __future__ import annotations

from stages.core.text import is_well_formed
from stages.rewards.base import Reward, completion_text


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
