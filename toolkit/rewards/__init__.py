"""Rewards and verifiers behind a name registry.

`get_reward(name, **params)` returns a picklable callable with TRL's reward signature,
`f(prompts, completions, **columns) -> list[float | None]`: completions are strings or chat
messages, the gold answer arrives as the `answer` column, and None means "cannot judge". Each
reward keeps `counters` (timeouts, errors, None answers, sandbox runs) and `tags` for the stage's
MLflow run (`reward_counter_metrics`, `reward_tags`).

A new reward is a `Reward` subclass in a module here and one entry in `REWARDS` below; recipes
then name it under `rewards:`. Imports only `toolkit.core`.
"""

from __future__ import annotations

from toolkit.rewards.base import Reward, completion_text
from toolkit.rewards.code import CodeExec
from toolkit.rewards.format import FormatTags, FormatThink, ThinkingFlag
from toolkit.rewards.ifeval import IfevalConstraints
from toolkit.rewards.language import LanguageConsistency
from toolkit.rewards.length import CosineLength, LengthKimi, OverlongDapo, Repetition
from toolkit.rewards.math import AccuracyMath
from toolkit.rewards.reward_model import RewardModelScore
from toolkit.rewards.sandbox import SandboxUnavailable

REWARDS: dict[str, type[Reward]] = {cls.name: cls for cls in (
    AccuracyMath, FormatThink, FormatTags, LanguageConsistency, LengthKimi, OverlongDapo, CosineLength,
    Repetition, CodeExec, IfevalConstraints, RewardModelScore, ThinkingFlag)}

__all__ = ["REWARDS", "Reward", "completion_text", "get_reward", "check_reward", "reward_stats", "combined",
           "distinct_names"]


def get_reward(name: str, stage_max_length: int | None = None, **params) -> Reward:
    """The reward `name` built with `params`; a length parameter left unset takes `stage_max_length`."""
    if name not in REWARDS:
        raise KeyError(f"unknown reward {name!r}; known: {sorted(REWARDS)}")
    cls = REWARDS[name]
    if cls.length_param and params.get(cls.length_param) is None and stage_max_length:
        params = {**params, cls.length_param: stage_max_length}
    return cls(**params)


def check_reward(name: str, params: dict, stage_max_length: int | None = None) -> str | None:
    """None if the reward builds with `params` (for a stage whose completions are capped at
    `stage_max_length` tokens), else the reason it would not."""
    if name not in REWARDS:
        return f"unknown reward {name!r}; known: {', '.join(sorted(REWARDS))}"
    try:
        reward = get_reward(name, stage_max_length, **params)
    except (TypeError, ValueError, SandboxUnavailable) as e:
        return f"reward {name}: {e}"
    if stage_max_length and isinstance(reward, OverlongDapo) and (msg := reward.reachable(stage_max_length)):
        return f"reward {name}: {msg}"
    return None


def check_reward_specs(specs, stage_max_length: int | None = None) -> list[tuple[tuple, str]]:
    """(path under the list, message) for every RewardSpec that names no reward or has bad params."""
    errors = []
    for j, spec in enumerate(specs):
        if msg := check_reward(spec.name, spec.params, stage_max_length):
            errors.append(((j, "name" if "unknown reward" in msg else "params"), msg))
        elif REWARDS[spec.name].accuracy and spec.weight <= 0:
            errors.append(((j, "weight"), f"reward {spec.name} judges whether the task was done: a weight of "
                           f"{spec.weight} would {'ignore' if spec.weight == 0 else 'punish'} doing it"))
    return errors


def distinct_names(rewards: list) -> list:
    """`rewards`, each with a `__name__` of its own within the list (the first of a name keeps it,
    later ones get `_2`, `_3`, ...). The name keys a reward's logged mean, std and counters, in
    TRL's `rewards/<name>/mean` as in an evaluation's `eval/rewards/<name>/mean`: two rewards of one
    name, say two reward models of the same scope, would otherwise be averaged or overwritten into
    one line."""
    taken: set[str] = set()
    for reward in rewards:
        name, k = reward.__name__, 1
        while name in taken:
            k += 1
            name = f"{reward.__name__}_{k}"
        reward.__name__ = name
        taken.add(name)
    return rewards


def reward_stats(name: str, values: list) -> dict[str, float]:
    """mean, std and None count of one reward over a batch, for MLflow."""
    judged = [float(v) for v in values if v is not None]
    mean = sum(judged) / len(judged) if judged else 0.0
    std = (sum((v - mean) ** 2 for v in judged) / len(judged)) ** 0.5 if judged else 0.0
    return {f"rewards/{name}/mean": mean, f"rewards/{name}/std": std,
            f"rewards/{name}/none": float(len(values) - len(judged))}


def reward_counter_metrics(rewards, prefix: str = "") -> dict[str, float]:
    """Every reward's counters as metrics: `<prefix>rewards/<name>/<counter>`."""
    return {f"{prefix}rewards/{r.__name__}/{k}": float(v) for r in rewards for k, v in r.counters.items()}


def reward_tags(rewards) -> dict[str, str]:
    return {k: v for r in rewards for k, v in r.tags.items()}


def combined(rewards: dict[str, list], weights: dict[str, float]) -> list[float]:
    """Weighted sum per sample; a None (cannot judge) contributes nothing, as in TRL."""
    n = len(next(iter(rewards.values())))
    return [sum(weights[k] * v[i] for k, v in rewards.items() if v[i] is not None) for i in range(n)]
