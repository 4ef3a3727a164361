"""Recipes: YAML files validated by pydantic before any model or dataset is touched.

A recipe is resolved in layers, each later one winning:
    the stage kind's defaults  <  recipes/<name>.yaml  <  recipes/profiles/<profile>.yaml  <  --set
A profile scales a recipe to hardware: it maps model aliases (`base`, `student`) to real models
and overrides fields per stage kind (`sft: {max_steps: 4}`) or per stage name. Every value
remembers where it came from, so an error names the file and line (or the --set) and the YAML path
such as `stages[1].data.n`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import Field, ValidationError

from pipeline import yaml_files
from pipeline.recipe_checks import pydantic_errors, semantic_errors
from pipeline.store.probe_cache import remembered_probes
from stages.common import Strict
from stages.evaluate import EvalSpec
from stages.registry import STAGE_CONFIGS

REPO_ROOT = Path(__file__).resolve().parent.parent
RECIPES_DIR = REPO_ROOT / "recipes"
PROFILES_DIR = RECIPES_DIR / "profiles"

StageConfig = Annotated[Union[tuple(STAGE_CONFIGS.values())], Field(discriminator="kind")]  # noqa: UP007


class TrackingSpec(Strict):
    model_artifacts: Literal["copy", "reference"] | None = Field(
        None, description="stage models in MLflow: copy = upload the weights to the artifact store; reference = "
        "record their directory and checksum. Default: copy for an http(s) tracking server, else reference")


RECIPE_NAME = r"^[a-z0-9][a-z0-9_-]*$"  # it names folders under $POSTTRAIN_HOME: never a path


class Recipe(Strict):
    name: str = Field(pattern=RECIPE_NAME, description="lowercase letters, digits, _ and -; it names the "
                      "recipe's folders, so no path")
    description: str = ""
    launch: str = Field("", description="how to launch it, shown by `posttrain list`")
    eval: EvalSpec | None = Field(default_factory=EvalSpec)
    stages: list[StageConfig] = Field(min_length=1)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    profile_overrides: dict[str, dict[str, dict]] = Field(
        default_factory=dict, description="profile -> stage name or kind -> fields, applied after that profile "
        "(e.g. a warm-up this recipe needs longer on `tiny` than the profile gives every SFT stage)")


class Profile(Strict):
    description: str = ""
    models: dict[str, str] = Field(default_factory=dict, description="model alias -> model reference")
    stages: dict[str, dict] = Field(default_factory=dict, description="stage kind or name -> field overrides")
    eval: dict = Field(default_factory=dict)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="wins over the recipe's")
    generation: dict = Field(default_factory=dict, description="engine and precision for every stage's sampling "
                             "and the evaluation; a stage's own `generation` fields win")


class RecipeError(Exception):
    """Every problem found in a recipe, each as 'where: what'. The CLI exits 2 on it."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))


@dataclass
class ResolvedRecipe:
    recipe: Recipe
    profile: str | None
    source: Path
    overrides: list[str] = field(default_factory=list)


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def _display(path: Path) -> Path:
    """A path as short as it can be said: relative to the working directory when inside it."""
    try:
        return Path(path).resolve().relative_to(Path.cwd())
    except ValueError:
        return Path(path)


def recipe_path(ref: str) -> Path:
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise RecipeError([f"{ref}: no such recipe file"])
        return p
    p = RECIPES_DIR / f"{ref}.yaml"
    if not p.exists():
        raise RecipeError([f"recipe {ref!r} not found; known recipes: {', '.join(list_recipes())}"])
    return p


# ---------------------------------------------------------------- YAML with line numbers

def _read_yaml(path: Path) -> tuple[dict, dict[tuple, str]]:
    """(data, {path tuple: "file:line"}) for a YAML mapping, read as untrusted input (yaml_files)."""
    shown = _display(path)
    try:
        data, where = yaml_files.load(path, shown)
    except yaml_files.YAMLRefused as e:
        raise RecipeError(str(e).splitlines()) from None
    if not isinstance(data, dict):
        raise RecipeError([f"{shown}: top level must be a mapping"])
    return data, where


def _override_stages(stages: list, overrides: dict, where: dict, origin, label: str) -> list[str]:
    """Apply {stage name or kind: {field: value}} to the stages; `origin(key, field)` is file:line."""
    errors = []
    names = {s.get("name"): i for i, s in enumerate(stages) if isinstance(s, dict)}
    for key, fields in overrides.items():
        targets = [names[key]] if key in names else [
            i for i, s in enumerate(stages) if isinstance(s, dict) and s.get("kind") == key]
        if key not in names and key not in STAGE_CONFIGS:
            errors.append(f"{origin(key, None)}: {label}.{key}: not a stage name or kind")
        for i in targets:
            for fname, value in (fields or {}).items():
                stages[i][fname] = copy.deepcopy(value)
                _replaced(where, ("stages", i, fname), origin(key, fname))
    return errors


def _replaced(where: dict, loc: tuple, origin: str) -> None:
    """Record that the value at `loc` now comes from `origin`: the lines of the value it replaced
    (its nested fields) no longer say where anything under `loc` came from."""
    for old in [k for k in where if k[:len(loc)] == loc]:
        del where[old]
    where[loc] = origin


def _apply_profile(data: dict, where: dict, name: str, profile: Profile, profile_where: dict, pfile: Path,
                   rfile: Path) -> list[str]:
    stages = data.get("stages") or []
    errors = _override_stages(stages, profile.stages, where, lambda k, f: profile_where.get(
        ("stages", k) + ((f,) if f else ()), str(pfile)), "profile stages")
    own = (data.get("profile_overrides") or {}).get(name) or {}
    rwhere = dict(where)
    errors += _override_stages(stages, own, where, lambda k, f: rwhere.get(
        ("profile_overrides", name, k) + ((f,) if f else ()), str(rfile)), f"profile_overrides.{name}")
    for fname, value in profile.eval.items():
        if "eval" in data and not isinstance(data["eval"], dict):
            break  # the recipe switched evaluation off (`eval: null`)
        data.setdefault("eval", {})[fname] = copy.deepcopy(value)
        where[("eval", fname)] = profile_where.get(("eval", fname), str(pfile))
    if profile.generation:  # defaults under each stage's own and the evaluation's own settings
        data.setdefault("eval", {})
        for target in [s for s in stages if isinstance(s, dict)] + [e for e in [data["eval"]] if isinstance(e, dict)]:
            own = target.get("generation") or {}
            target["generation"] = {**profile.generation, **own} if isinstance(own, dict) else own
    for fname, value in profile.tracking.model_dump(exclude_none=True).items():
        data.setdefault("tracking", {})[fname] = value
        where[("tracking", fname)] = profile_where.get(("tracking", fname), str(pfile))
    # Model aliases: any model field whose value is an alias takes the profile's model.
    for s in stages:
        kind = STAGE_CONFIGS.get(s.get("kind")) if isinstance(s, dict) else None
        for fname in getattr(kind, "MODEL_FIELDS", ()):
            value = s.get(fname)
            if isinstance(value, list):
                s[fname] = [profile.models.get(v, v) if isinstance(v, str) else v for v in value]
            elif isinstance(value, str) and value in profile.models:
                s[fname] = profile.models[value]
    return errors


def _apply_overrides(data: dict, where: dict, overrides: list[str]) -> list[str]:
    errors = []
    stages = data.get("stages") or []
    names = {s.get("name"): i for i, s in enumerate(stages) if isinstance(s, dict)}
    for item in overrides:
        if "=" not in item:
            errors.append(f"--set {item}: expected key=value")
            continue
        key, raw = item.split("=", 1)
        keys: list = key.strip().split(".")
        try:
            value = yaml_files.load_value(raw, f"--set {key}")
        except yaml_files.YAMLRefused as e:
            errors.append(str(e))
            continue
        if keys[0] == "stages":
            if len(keys) < 3 or keys[1] not in names:
                errors.append(f"--set {key}: use stages.<name>.<field>; stages are {', '.join(map(str, names))}")
                continue
            keys = ["stages", names[keys[1]]] + keys[2:]
        try:
            target = data
            for k in keys[:-1]:  # a list's items by index (`rewards.0.weight`), a mapping's by name
                target = target[_index(k)] if isinstance(target, list) else target.setdefault(k, {})
            target[_index(keys[-1]) if isinstance(target, list) else keys[-1]] = value
        except (KeyError, TypeError, IndexError, ValueError, AttributeError):
            errors.append(f"--set {key}: no such field path")
            continue
        _replaced(where, tuple(keys), f"--set {item}")
    return errors


def _index(k) -> int:
    if isinstance(k, int):
        return k
    if not k.isdigit():  # "-1" or a name: not an item of a list
        raise ValueError(k)
    return int(k)


def load_profile(name: str) -> tuple[Profile, dict, Path]:
    if name not in list_profiles():  # a name, never a path: `--profile ../smoke` must not read a recipe
        raise RecipeError([f"profile {name!r} not found; profiles: {', '.join(list_profiles())}"])
    path = PROFILES_DIR / f"{name}.yaml"
    if not path.exists():
        raise RecipeError([f"profile {name!r} not found; profiles: {', '.join(list_profiles())}"])
    data, where = _read_yaml(path)
    try:
        return Profile.model_validate(data), where, path
    except ValidationError as e:
        raise RecipeError(pydantic_errors(e, data, where, str(path))) from None


def load_recipe(ref: str, profile: str | None = None, overrides: list[str] | None = None) -> ResolvedRecipe:
    """Read, layer and validate a recipe. Raises RecipeError listing every problem found."""
    overrides = list(overrides or [])
    path = recipe_path(ref)
    data, where = _read_yaml(path)
    errors: list[str] = []
    # The recipe must be valid on its own: a bad value that a profile happens to override is still
    # a bug in the file, and would surface with the next profile.
    try:
        Recipe.model_validate(copy.deepcopy(data))
    except ValidationError as e:
        errors += pydantic_errors(e, data, where, str(path))
    if profile:
        prof, pwhere, ppath = load_profile(profile)
        errors += _apply_profile(data, where, profile, prof, pwhere, ppath, path)
    errors += _apply_overrides(data, where, overrides)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        errors += [m for m in pydantic_errors(e, data, where, str(path)) if m not in errors]
    if errors:
        raise RecipeError(errors)
    with remembered_probes():
        errors = semantic_errors(recipe, where, str(path))
    if errors:
        raise RecipeError(errors)
    return ResolvedRecipe(recipe=recipe, profile=profile, source=path, overrides=overrides)
