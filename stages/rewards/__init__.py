"""Rewards and verifiers behind a name registry.

`get_reward(name, **params)` returns a function with TRL's reward signature,
`f(prompts, completions, **columns) -> list[float | None]`: completions are strings or chat
messages, the gold answer arrives as the `answer` column, and None means "cannot judge".
"""

from __future__ import annotations

from collections.abc import Callable

from stages.rewards import format as format_rewards
from stages.rewards import math as math_rewards

RewardFn = Callable[..., list]

REWARDS: dict[str, Callable[..., RewardFn]] = {
    "accuracy_math": math_rewards.accuracy_math,
    "format_think": format_rewards.format_think,
}


def get_reward(name: str, **params) -> RewardFn:
    if name not in REWARDS:
        raise KeyError(f"unknown reward {name!r}; known: {sorted(REWARDS)}")
    fn = REWARDS[name](**params)
    fn.__name__ = name  # TRL names the per-reward metrics after the function
    return fn


def completion_text(completion) -> str:
    """The assistant text of a completion given as a string or as chat messages."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if m.get("role", "assistant") == "assistant")
