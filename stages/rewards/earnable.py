"""Can a stage earn its rewards? Validation renders a correct answer in the stage template's format
(stages.core.templates.reference_completion) and scores it with every accuracy-type reward; one that
stays below its maximum can never be earned, whatever the policy learns. This catches a template
and a reward that disagree on where the answer goes (R1-Zero's <answer> tags read by a reward that
looks for \\boxed{}), before any compute is spent."""

from __future__ import annotations

import functools
import json

from stages.core.templates import reference_completion
from stages.rewards import get_reward

PROBE_GOLD = "42"
PROBE_CODE = "def answer():\n    return 42"
PROBE_TESTS = json.dumps({"tests": ["assert answer() == 42"]})


def probe(name: str, template: str) -> tuple[str, str]:
    """(completion, gold column) of a correct sample for reward `name` under `template`."""
    if name == "code_exec":
        return reference_completion(template, code=PROBE_CODE), PROBE_TESTS
    return reference_completion(template, answer=PROBE_GOLD), PROBE_GOLD


def unearnable(specs, template: str, stage_max_length: int | None = None) -> list[tuple[tuple, str]]:
    """(path under the reward list, message) for every accuracy-type reward that a correct,
    template-shaped completion does not max out."""
    errors = []
    for j, spec in enumerate(specs):
        found = probe_score(spec.name, json.dumps(spec.params, sort_keys=True), template, stage_max_length)
        if found is None:
            continue
        value, max_value, completion = found
        if value is None or value < max_value:
            errors.append(((j, "params"), f"reward {spec.name} {spec.params or ''} cannot be earned with template "
                           f"{template!r}: a correct answer in that format scores {value}, not {max_value} "
                           f"(answer checked: {completion!r})"))
    return errors


@functools.cache  # a run validates its recipe twice (the CLI, then the flow); score each probe once
def probe_score(name: str, params: str, template: str, stage_max_length: int | None):
    """(score, maximum, completion) of the probe for an accuracy-type reward; None for others."""
    reward = get_reward(name, stage_max_length, **json.loads(params))
    if not reward.accuracy:
        return None
    completion, gold = probe(name, template)
    return reward(prompts=["probe"], completions=[completion], answer=[gold], language=["en"])[0], \
        reward.max_value, completion
