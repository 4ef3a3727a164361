"""Can a stage's rewards ever score, and score what they were made for? Validation follows each
stage's data back to its named sources to learn which verifiers its rows carry ("math", "code",
"ifeval", "none"), and refuses a reward that judges only rows no input can hold: `only: [code]` on
math-only data, or `code_exec` (which by default judges code rows alone) in a math stage. Such a
reward is None on every row: it never trains anything, and its weight silently rescales the others.

A stage's dataset output is taken to carry the verifiers of its data inputs (filters keep a subset,
fusion and sampling stages keep their rows' verifiers). A file's rows may carry any verifier (each
row says), so a stage fed from one, or from anything downstream of one, is never refused.

A `reward_model` reward that applies a recipe's `reward_model` stage must use the scope that stage
trained on (`answer`: the text after the thinking; `full`: all of it); `scope_mismatches` refuses
the others."""

from __future__ import annotations

from data_curation.sources import source_verifiers
from toolkit.rewards.verifiers import VERIFIER_REWARDS


def judged_verifiers(spec) -> set[str]:
    """The row verifiers a RewardSpec judges; empty when it judges every row."""
    return set(spec.only or [v for v, name in VERIFIER_REWARDS.items() if name == spec.name])


def unreachable_rewards(stages) -> list[tuple[int, tuple, str]]:
    """(stage index, path under the stage, message) for every reward no row of its stage can reach."""
    carried: dict[str, set[str] | None] = {}  # stage name -> verifiers of its dataset output
    errors = []
    for i, stage in enumerate(stages):
        known: set[str] | None = set()
        for spec in stage.data_inputs().values():
            ref = spec.stage_ref
            have = carried.get(ref.split(".", 1)[0]) if ref else source_verifiers(spec.source)
            known = None if (known is None or have is None) else known | have
        carried[stage.name] = known
        if known is None or not known:
            continue
        for j, reward in enumerate(getattr(stage, "rewards", None) or []):
            judged = judged_verifiers(reward)
            if judged and not judged & known:
                field = "only" if reward.only else "name"
                errors.append((i, ("rewards", j, field),
                               f"reward {reward.name} judges only {sorted(judged)} rows, and this stage's data "
                               f"holds only {sorted(known)} rows: it would score None on every row"))
    return errors


def scope_mismatches(stages) -> list[tuple[int, tuple, str]]:
    """(stage index, path, message) for every reward_model reward whose scope differs from the one the
    recipe's reward-model stage it names was trained on."""
    trained = {s.name: s.scope for s in stages if s.kind == "reward_model"}
    errors = []
    for i, stage in enumerate(stages):
        for j, reward in enumerate(getattr(stage, "rewards", None) or []):
            model = str(reward.params.get("model", ""))
            rm_stage = model.removesuffix(".model") if model.endswith(".model") else None
            scope = reward.params.get("scope", "full")
            if reward.name == "reward_model" and rm_stage in trained and trained[rm_stage] != scope:
                errors.append((i, ("rewards", j, "params", "scope"),
                               f"reward_model applies {model} to the {scope!r} view of responses, and stage "
                               f"{rm_stage!r} trains it on the {trained[rm_stage]!r} view: set the same scope on both"))
    return errors
