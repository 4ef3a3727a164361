"""What every reward is: a picklable callable with TRL's signature,
`reward(prompts, completions, **columns) -> list[float | None]` (None = cannot judge), a `__name__`
(TRL names its metrics after it), `counters` (events worth logging: timeouts, errors, None
answers) and `tags` (facts about how it ran, such as the sandbox engine), both logged to the
stage's MLflow run. Objects rather than closures, because TRL's asynchronous rollout workers pickle
the reward functions."""

from __future__ import annotations

from typing import ClassVar


def completion_text(completion) -> str:
    """The assistant text of a completion given as a string or as chat messages."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if m.get("role", "assistant") == "assistant")


class Reward:
    name: ClassVar[str]
    # An accuracy-type reward: a correct answer written in the stage template's format reaches
    # `max_value`; recipe validation checks that it does (toolkit.rewards.earnable).
    accuracy: ClassVar[bool] = False
    max_value: ClassVar[float] = 1.0
    # The parameter that defaults to the stage's maximum completion length, if any.
    length_param: ClassVar[str | None] = None

    def __init__(self, *counters: str):
        self.counters: dict[str, int] = dict.fromkeys(counters, 0)
        self.tags: dict[str, str] = {}
        self.__name__ = self.name
