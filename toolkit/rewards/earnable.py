"""Can a stage earn its rewards? Validation renders a correct answer in the stage template's format
(toolkit.core.templates.reference_completion) and scores it with every accuracy-type reward; one that
stays below its maximum can never be earned, whatever the policy learns. This catches a template
and a reward that disagree on where the answer goes (R1-Zero's <answer> tags read by a reward that
looks for \\boxed{}), before any compute is spent. Length rewards judge correctness with an
accuracy reward of their own: that one is probed the same way, and must read the answer where the
stage's `accuracy_math` does (the same answer options), or the two would pay for different answers."""

from __future__ import annotations

import json

from toolkit.core.templates import reference_completion
from toolkit.rewards import get_reward

LENGTH_REWARDS = ("cosine_length", "length_kimi")  # they judge correctness with an accuracy_math of their own
ANSWER_OPTIONS = {"answer_is_fallback": True, "answer_tags": False, "after_think": False}  # accuracy_math's defaults
PROBE_GOLD = "42"
PROBE_CODE = "def answer():\n    return 42"
PROBE_TESTS = json.dumps({"tests": ["assert answer() == 42"]})


def probe(name: str, template: str) -> tuple[str, str]:
    """(completion, gold column) of a correct sample for reward `name` under `template`."""
    if name == "code_exec":
        return reference_completion(template, code=PROBE_CODE), PROBE_TESTS
    return reference_completion(template, answer=PROBE_GOLD), PROBE_GOLD


_EARNED: set[tuple] = set()  # probes that scored their maximum (a run validates twice; see `remember`)


def earned() -> list[list]:
    """The passing probes so far, as JSON-ready lists (pipeline.recipe keeps them between processes)."""
    return sorted(list(key) for key in _EARNED)


def remember(keys: list[list]) -> None:
    """Take passing probes saved by an earlier process running the same reward code."""
    _EARNED.update(tuple(key) for key in keys)


def unearnable(specs, template: str, stage_max_length: int | None = None) -> list[tuple[tuple, str]]:
    """(path under the reward list, message) for every accuracy-type reward that a correct,
    template-shaped completion does not max out. Only passes are remembered: a probe that failed,
    perhaps by timing out on a busy machine, is scored again next time."""
    errors = []
    for j, spec in enumerate(specs):
        key = (spec.name, json.dumps(spec.params, sort_keys=True), template, stage_max_length)
        if key in _EARNED:
            continue
        reward = get_reward(spec.name, stage_max_length, **spec.params)
        judge = reward if reward.accuracy else getattr(reward, "accuracy_reward", None)
        if judge is not None:
            completion, gold = probe(judge.name, template)
            value = judge(prompts=["probe"], completions=[completion], answer=[gold], language=["en"])[0]
            if value is None or value < judge.max_value:
                what = ("" if judge is reward else "'s correctness check") + (f" {spec.params}" if spec.params else "")
                errors.append(((j, "params"), f"reward {spec.name}{what} cannot be earned with "
                               f"template {template!r}: a correct answer in that format scores {value}, not "
                               f"{judge.max_value} (answer checked: {completion!r})"))
                continue
        _EARNED.add(key)
    errors += mismatched_answer_options(specs)
    return errors


def answer_options(params: dict) -> dict:
    return {k: params.get(k, default) for k, default in ANSWER_OPTIONS.items()}


def mismatched_answer_options(specs) -> list[tuple[tuple, str]]:
    """A length reward whose correctness reads the answer elsewhere than the stage's accuracy_math."""
    accuracy = [s for s in specs if s.name == "accuracy_math"]
    if not accuracy:
        return []
    wanted = answer_options(accuracy[0].params)
    return [((j, "params"), f"reward {spec.name} judges correctness with {answer_options(spec.params)}, the stage's "
             f"accuracy_math with {wanted}: set the same answer options on both")
            for j, spec in enumerate(specs) if spec.name in LENGTH_REWARDS and answer_options(spec.params) != wanted]
