"""What a recipe must satisfy beyond its schema, and how every error names where it came from.

A schema error (pydantic) and a semantic one (a stage input that names a later stage, an output
the upstream kind does not produce, a reward that cannot be earned, a launcher that cannot start,
a gate on a stage that is not evaluated, ...) are both reported as `file:line: stages[1].data.n:
message`, all at once, before anything runs. `pipeline.recipe` reads and layers the YAML and
calls these; `where` maps each YAML path to the file and line (or `--set`) its value came from.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from data_curation.sources import check_data_spec
from pipeline.models.named import check_model_ref
from pipeline.models.tokenizer_check import distill_tokenizer_errors
from stages.common import field_loc
from stages.evaluate import SWEEP_PREFIXES
from stages.launch import host_slots
from stages.registry import STAGE_CONFIGS
from stages.reward_reach import scope_mismatches, unreachable_rewards
from toolkit.rewards import check_reward_specs
from toolkit.rewards.earnable import unearnable

DEEPSPEED_DIR = Path(__file__).resolve().parent.parent / "infra" / "deepspeed"


# ---------------------------------------------------------------- errors with YAML paths

def _loc_path(loc: tuple) -> tuple:
    """Drop pydantic's discriminator tag from a location: ('stages', 0, 'sft', 'x') -> ('stages', 0, 'x')."""
    out = list(loc)
    if len(out) >= 3 and out[0] == "stages" and isinstance(out[1], int) and out[2] in STAGE_CONFIGS:
        del out[2]
    return tuple(out)


def format_path(loc: tuple) -> str:
    s = ""
    for part in loc:
        s += f"[{part}]" if isinstance(part, int) else (f".{part}" if s else str(part))
    return s or "(top level)"


def where_of(loc: tuple, where: dict, default: str) -> str:
    for n in range(len(loc), -1, -1):
        if loc[:n] in where:
            return where[loc[:n]]
    return default


def pydantic_errors(e: ValidationError, data: dict, where: dict, default: str) -> list[str]:
    out = []
    for err in e.errors():
        loc = _loc_path(err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"unknown field {loc[-1]!r}"
        elif err["type"] == "union_tag_invalid":
            kind = err["input"].get("kind") if isinstance(err.get("input"), dict) else None
            msg = f"unknown stage kind {kind!r}; known kinds: {', '.join(STAGE_CONFIGS)}"
        out.append(f"{where_of(loc, where, default)}: {format_path(loc)}: {msg}")
    return out


# ---------------------------------------------------------------- checks beyond the schema

def is_evaluated(recipe, stage) -> bool:
    """Whether the recipe's evaluation runs on this stage's model: decided here, once."""
    return recipe.eval is not None and stage.evaluate and "model" in stage.OUTPUTS and stage.GENERATES


def semantic_errors(recipe, where: dict, default: str) -> list[str]:
    errors = []

    def add(loc: tuple, msg: str):
        errors.append(f"{where_of(loc, where, default)}: {format_path(loc)}: {msg}")

    produced: dict[str, tuple[str, ...]] = {}
    order = [s.name for s in recipe.stages]
    for i, stage in enumerate(recipe.stages):
        loc = ("stages", i)
        if stage.name in produced:
            add(loc + ("name",), f"duplicate stage name {stage.name!r}")
        for fpath, ref, wanted in stage.refs():
            upstream, output = ref.split(".", 1)
            floc = loc + field_loc(fpath)
            if upstream not in order:
                add(floc, f"{ref!r} names no stage; stages are {', '.join(order)}")
            elif upstream not in produced:
                add(floc, f"{ref!r} refers to stage {upstream!r}, which runs later (stage {order.index(upstream)}); "
                          "inputs must come from earlier stages")
            elif output not in produced[upstream]:
                add(floc, f"stage {upstream!r} ({recipe.stages[order.index(upstream)].kind}) produces "
                          f"{list(produced[upstream])}, not {output!r}")
            elif output != wanted:
                add(floc, f"{ref!r} is a stage's `{output}` output; this field takes `<stage>.{wanted}`")
        ref_fields = {f for f, _, _ in stage.refs()}
        for fpath, value in stage.model_inputs().items():
            if fpath not in ref_fields and (msg := check_model_ref(value)):
                add(loc + field_loc(fpath), msg)
        for fpath, spec in stage.data_inputs().items():
            if not spec.stage_ref:
                for rel, msg in check_data_spec(spec.source, spec.params, spec.split):
                    add(loc + field_loc(fpath) + rel, msg)
        for rel, msg in _launcher_errors(stage):
            add(loc + ("launcher",) + rel, msg)
        for rel, msg in stage.semantic_errors():
            add(loc + rel, msg)
        for rel, msg in stage.generation.problems():
            add(loc + ("generation",) + rel, msg)
        if stage.gate is not None and not is_evaluated(recipe, stage):
            add(loc + ("gate",), "a gate compares held-out metrics, and this stage is not evaluated (no recipe "
                                 "`eval`, `evaluate: false`, or no model output that generates)")
        elif stage.gate is not None and stage.evaluate == "greedy" and stage.gate.metric.startswith(SWEEP_PREFIXES):
            add(loc + ("gate",), f"the gate reads {stage.gate.metric}, which `evaluate: greedy` does not measure")
        elif stage.gate is not None and stage.EVAL_INPUT is None:
            add(loc + ("gate",), f"a {stage.kind} stage has no single input model to compare with")
        produced[stage.name] = stage.OUTPUTS
    if recipe.eval is not None:
        for rel, msg in recipe.eval.generation.problems():
            add(("eval", "generation") + rel, msg)
        reward_errors = check_reward_specs(recipe.eval.rewards, recipe.eval.max_new_tokens)
        for rel, msg in reward_errors or unearnable(recipe.eval.rewards, recipe.eval.template, recipe.eval.max_new_tokens):
            add(("eval", "rewards") + rel, msg)
        spec = recipe.eval.data
        if spec.stage_ref:
            add(("eval", "data", "source"), "evaluation data must be a named source, not a stage output")
        for rel, msg in check_data_spec(spec.source, spec.params, spec.split):
            add(("eval", "data") + rel, msg)
        for i, stage in enumerate(recipe.stages):
            if getattr(stage, "cut_thinking_share", 0) and stage.stop_thinking != recipe.eval.stop_thinking:
                add(("stages", i, "stop_thinking"), "cut thoughts end with another string than the one the "
                    "evaluation's budgets insert (eval.stop_thinking): the model would learn one and be tested on the other")
    for i, msg in distill_tokenizer_errors(recipe.stages):
        add(("stages", i, "student"), msg)
    for i, rel, msg in unreachable_rewards(recipe.stages) + scope_mismatches(recipe.stages):
        add(("stages", i) + rel, msg)
    return errors




def _launcher_errors(stage) -> list[tuple[tuple, str]]:
    """A stage's launch settings beyond their schema. A hostfile is read here, once: the plan carries
    its lines, so every node launches from the same list."""
    launcher, errors = stage.launcher, []
    if launcher.mode == "deepspeed" and not deepspeed_config_path(launcher.deepspeed_config).exists():
        errors.append((("deepspeed_config",), f"no DeepSpeed config {launcher.deepspeed_config!r} "
                                              f"(looked for {deepspeed_config_path(launcher.deepspeed_config)})"))
    if isinstance(launcher.nodes, str):
        try:
            launcher.nodes = [f"{host} slots={slots}" for host, slots in host_slots(launcher)]
        except ValueError as e:
            errors.append((("nodes",), str(e)))
    if launcher.rollout_server is not None and getattr(stage, "rollout", None) != "vllm_server":
        errors.append((("rollout_server",), f"a rollout server serves `rollout: vllm_server` stages; {stage.name} "
                                            f"({stage.kind}) does not roll out through one"))
    return errors


def deepspeed_config_path(name: str) -> Path:
    p = Path(name)
    return p if p.suffix == ".json" else DEEPSPEED_DIR / f"{name}.json"
