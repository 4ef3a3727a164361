"""Format rewards: DeepSeek-R1's reasoning-in-<think> layout and R1-Zero's <answer> tag style
(`format_think`, all or nothing), and a tag count with partial credit (`format_tags`) for shaping
early RL on small models: each of <think>, </think> and, with answer tags, <answer>, </answer>
that appears exactly once earns its share, and only while those tags stand in that order (tags out
of order, or an answer inside the thinking, earn nothing). `thinking_flag`: Qwen3's format following with the flags
(stage 4): the completion obeys the /think or /no_think its prompt asks for."""

from __future__ import annotations

from toolkit.core.text import is_well_formed
from toolkit.core.thinking import complies, flag_of, governing_mode
from toolkit.rewards.base import Reward, completion_text


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
        return [self.score(completion_text(c)) for c in completions]

    def score(self, text: str) -> float:
        once = [tag for tag in self.tags_counted if text.count(tag) == 1]
        positions = [text.find(tag) for tag in once]
        if positions != sorted(positions):
            return 0.0
        return len(once) / len(self.tags_counted)


class ThinkingFlag(Reward):
    """1 when the completion follows the mode its prompt asks for (the last /think or /no_think
    flag in a user or system turn; thinking by default): the empty think block for /no_think,
    some thinking for /think. Prompts come as chat messages or, with plain templates, as text.
    A think block left open complies only in a completion the token limit cut: `max_len` tokens
    of `completion_ids` (the stage's max completion length by default). Without ids or a limit,
    no completion counts as cut."""
    name = "thinking_flag"
    length_param = "max_len"

    def __init__(self, max_len: int | None = None):
        super().__init__()
        if max_len is not None and max_len < 1:
            raise ValueError(f"thinking_flag: max_len must be at least 1, got {max_len}")
        self.max_len = max_len

    def __call__(self, prompts=None, completions=(), completion_ids=None, **_) -> list[float | None]:
        prompts = prompts or [None] * len(completions)
        if completion_ids is None or self.max_len is None:
            cut = [False] * len(completions)
        else:
            cut = [len(ids) >= self.max_len for ids in completion_ids]
        return [float(complies(completion_text(c), prompt_mode(p), cut=k))
                for p, c, k in zip(prompts, completions, cut, strict=True)]


def prompt_mode(prompt) -> str:
    if isinstance(prompt, list):
        return governing_mode(prompt)
    return flag_of(prompt or "") or "think"
