"""Rewards and verifiers behind a name registry.

`get_reward(name, **params)` returns a function with TRL's reward signature,
`f(prompts, completions, **columns) -> list[float | None]`: completions are strings or chat
messages, the gold answer arrives as the `answer` column, and None means "cannot judge".
"""

from __future__ import annotations

from collections.abc import Callable

from stages.rewards import code, ifeval, language, length
from stages.rewards import format as format_rewards
from stages.rewards import math as math_rewards

RewardFn = Callable[..., list]

REWARDS: dict[str, Callable[..., RewardFn]] = {
    "accuracy_math": math_rewards.accuracy_math,
    "format_think": format_rewards.format_think,
    "language_consistency": language.language_consistency,
    "length_kimi": length.length_kimi,
    "overlong_dapo": length.overlong_dapo,
    "cosine_length": length.cosine_length,
    "repetition": length.repetition,
    "code_exec": code.code_exec,
    "ifeval_constraints": ifeval.ifeval_constraints,
}


def get_reward(name: str, **params) -> RewardFn:
    if name not in REWARDS:
        raise KeyError(f"unknown reward {name!r}; known: {sorted(REWARDS)}")
    fn = REWARDS[name](**params)
    fn.__name__ = name  # TRL names the per-reward metrics after the function
    return fn


def check_reward(name: str, params: dict) -> str | None:
    """None if `name(**params)` would build a reward, else the reason it would not."""
    import inspect

    if name not in REWARDS:
        return f"unknown reward {name!r}; known: {', '.join(sorted(REWARDS))}"
    try:
        inspect.signature(REWARDS[name]).bind(**params)
    except TypeError as e:
        return f"reward {name}: {e}"
    return None


def check_reward_specs(specs) -> list[tuple[tuple, str]]:
    """(path under the list, message) for every RewardSpec that names no reward or has bad params."""
    errors = []
    for j, spec in enumerate(specs):
        if msg := check_reward(spec.name, spec.params):
            errors.append(((j, "name" if "unknown reward" in msg else "params"), msg))
    return errors


def completion_text(completion) -> str:
    """The assistant text of a completion given as a string or as chat messages."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if m.get("role", "assistant") == "assistant")


def reward_stats(name: str, values: list) -> dict[str, float]:
    """mean, std and None count of one reward over a batch, for MLflow."""
    judged = [float(v) for v in values if v is not None]
    mean = sum(judged) / len(judged) if judged else 0.0
    std = (sum((v - mean) ** 2 for v in judged) / len(judged)) ** 0.5 if judged else 0.0
    return {f"rewards/{name}/mean": mean, f"rewards/{name}/std": std,
            f"rewards/{name}/none": float(len(values) - len(judged))}


def combined(rewards: dict[str, list], weights: dict[str, float]) -> list[float]:
    """Weighted sum per sample; a None (cannot judge) contributes nothing, as in TRL."""
    n = len(next(iter(rewards.values())))
    return [sum(weights[k] * v[i] for k, v in rewards.items() if v[i] is not None) for i in range(n)]
