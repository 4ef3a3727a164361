"""Config pieces shared by every stage kind."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from stages.launch import LaunchSpec, Strict
from toolkit.rollouts import Engine, engine_problems, open_engine

STAGE_NAME = r"^[a-z][a-z0-9_]*$"


class DataSpec(Strict):
    """A dataset input: a named source (`synthetic_math`), a local file (`{path: x.jsonl, columns:
    {question: problem}}`), or an earlier stage's output (`filter_stage.dataset`)."""
    source: str
    split: Literal["train", "eval", "all"] = "train"
    n: int | None = Field(None, ge=1, description="number of rows; None = the source's default")
    seed: int = 0
    params: dict = Field(default_factory=dict, description="source-specific options")
    on_bad_rows: Literal["fail", "skip"] = Field("fail", description="skip (and count) rows that break the "
                                                 "schema instead of failing")

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, value):
        if isinstance(value, str):
            return {"source": value}
        if isinstance(value, dict) and "path" in value:  # a local file: path/columns/verifier are its params
            value = dict(value)
            params = {k: value.pop(k) for k in ("path", "columns", "verifier") if k in value}
            value["source"] = value.get("source", "file")
            value["params"] = {**params, **value.get("params", {})}
        return value

    @property
    def stage_ref(self) -> str | None:
        return self.source if "." in self.source and "/" not in self.source else None


class MixPart(Strict):
    """One dataset of a mixture, with how many of its rows to use."""
    data: DataSpec
    count: int | None = Field(None, ge=1, description="exactly this many rows (repeating rows if it has fewer)")
    weight: float | None = Field(None, gt=0, description="this multiple of its rows: 0.5 = half, 2 = each twice")
    ratio: float | None = Field(None, gt=0, description="this part's share of the mixture against the others' "
                                "ratios (3 and 1: three reasoning rows to one general); all parts or none")

    @model_validator(mode="after")
    def _one_size(self):
        if sum(x is not None for x in (self.count, self.weight, self.ratio)) > 1:
            raise ValueError("give a part one of count, weight and ratio")
        return self


class DataOrMix(Strict):
    """A stage's training rows: one dataset (`data`) or a mixture of several (`mix`), e.g. R1's
    reasoning and non-reasoning samples. Resolved by stages.runtime.training_rows."""
    data: DataSpec | None = Field(None, description="one dataset; or use `mix`")
    mix: list[MixPart] = Field(default_factory=list, description="several datasets with a count or weight each")
    mix_seed: int = 0
    exclude: list[DataSpec] = Field(default_factory=list, description="leave out rows whose question appears in "
                                    "any of these datasets (an earlier stage's `data`, say): a different seed does "
                                    "not make two draws from one source disjoint")

    @model_validator(mode="after")
    def _data_or_mix(self):
        if (self.data is None) == (not self.mix):
            raise ValueError("give exactly one of `data` (one dataset) and `mix` (several)")
        if 0 < sum(p.ratio is not None for p in self.mix) < len(self.mix):
            raise ValueError("ratios are shares of the whole mixture: give every part a `ratio`, or none")
        return self

    def data_inputs(self) -> dict[str, DataSpec]:
        excluded = {f"exclude.{i}": spec for i, spec in enumerate(self.exclude)}
        if self.mix:
            return {**{f"mix.{i}.data": part.data for i, part in enumerate(self.mix)}, **excluded}
        return {"data": self.data, **excluded}


class RewardSpec(Strict):
    """A reward from the registry (stages/rewards), by name, with its weight and parameters."""
    name: str
    weight: float = 1.0
    params: dict = Field(default_factory=dict)
    start_step: int = Field(0, ge=0, description="RL only: the reward counts from this optimizer step on "
                            "(Kimi k1.5 trains without its length reward first)")
    only: list[Literal["math", "code", "ifeval", "none"]] | None = Field(
        None, description="RL only: judge rows whose verifier is one of these, None elsewhere; by default a "
        "verifier's reward (accuracy_math, code_exec, ifeval_constraints) judges its own rows, any other every row")


class LoraSpec(Strict):
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class GenerationSpec(Strict):
    """How a model samples (toolkit.rollouts.engines): `auto` is the fastest engine here for the
    precision. Precision below float32 changes outputs: set it where benchmarks/bench_generation.py
    shows held-out accuracy and rewards stay within float32's interval."""
    engine: Literal["auto", "hf", "ct2", "ort", "ov", "vllm"] = "auto"
    precision: Literal["float32", "bfloat16", "int8", "int4"] = Field(
        "float32", description="bfloat16: HF, OpenVINO (AMX) or vLLM; int8: CTranslate2 (weights int8, activations float32); "
                               "int4: ONNX Runtime GenAI (weights int4, int8 activations)")

    def problems(self) -> list[tuple[tuple, str]]:
        return [((), msg) for msg in engine_problems(self.engine, self.precision)]

    def open(self, model_dir: str, trust_remote_code: bool = False) -> Engine:
        return open_engine(model_dir, self.engine, self.precision, trust_remote_code)


# Held-out metrics kept per prompt, so a change can be a paired comparison (pipeline.gates): the
# metric, and its key in a stage's eval_scores.json. Sampled pass@1 (the R1 paper's protocol) is
# kept only by evaluations with `samples`, so its change exists only where both sides sampled.
PAIRED_METRICS = {"eval/accuracy": "accuracy", "eval/format_rate": "format", "eval/completion_tokens_mean": "tokens",
                  "eval/pass_at_1": "pass_at_1"}
# An evaluation's rewards (EvalSpec.rewards) are kept per prompt too, as `reward/<name>`; their
# paired change is `change/eval/rewards/<name>/mean`.
REWARD_SCORES = "reward/"


def paired_keys(scores: dict) -> dict[str, str]:
    """The metric each per-prompt list of an eval_scores dict is the change of, by its key."""
    rewards = {f"eval/rewards/{k.removeprefix(REWARD_SCORES)}/mean": k for k in scores if k.startswith(REWARD_SCORES)}
    return {**{m: k for m, k in PAIRED_METRICS.items() if k in scores}, **rewards}


class GateSpec(Strict):
    """An evaluation gate: this stage's held-out metric against its input model's (the upstream
    stage's evaluation, or the input model evaluated once before training)."""
    metric: str = Field("eval/accuracy", description="a held-out metric; `accuracy` means eval/accuracy")
    min_delta: float = Field(0.0, description="the change over the input model required; negative allows a drop")
    on_fail: Literal["stop", "warn"] = Field("stop", description="stop: fail the pipeline; warn: tag the run, go on")
    significant: bool = Field(False, description="also ask that the 95% interval of the paired change lies above "
                              "min_delta (accuracy, format_rate, completion_tokens_mean)")

    @field_validator("metric")
    @classmethod
    def _eval_metric(cls, value: str) -> str:
        return value if value.startswith("eval/") else f"eval/{value}"

    @model_validator(mode="after")
    def _paired(self):
        if self.significant and self.metric not in PAIRED_METRICS:
            raise ValueError(f"significant: true needs a metric compared prompt by prompt: one of "
                             f"{sorted(PAIRED_METRICS)}, not {self.metric!r}")
        return self


class StageBase(Strict):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_by_name=True, validate_by_alias=True)
    name: str = Field(pattern=STAGE_NAME)
    launcher: LaunchSpec = Field(default_factory=LaunchSpec)
    evaluate: bool | Literal["greedy"] = Field(True, description="run the recipe's evaluation on this stage's model; "
                                               "greedy: its greedy pass only, without samples, modes or budgets")
    gate: GateSpec | None = Field(None, description="stop or warn when the held-out metric does not improve "
                                  "on the input model's (not part of the cache key)")
    # `register:` in YAML; named `registry` here because BaseModel's metaclass owns `register`.
    generation: GenerationSpec = Field(default_factory=GenerationSpec, description="the engine and precision of "
                                       "the stage's own sampling (filters, rejection and preference sampling, traces)")
    registry: str | bool | None = Field(
        None, alias="register", description="register the stage's model in the MLflow registry under this name (alias candidate; "
        "champion when its gate passes). Default: the recipe's final stage as posttrain-<recipe>; false: never")

    # Which outputs the stage produces ("model", "dataset", "pairs") and which fields name models.
    OUTPUTS: ClassVar[tuple[str, ...]] = ()
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = ()
    DATA_FIELDS: ClassVar[tuple[str, ...]] = ()
    PAIRS_FIELDS: ClassVar[tuple[str, ...]] = ()  # data fields holding preference pairs, not schema rows
    GENERATES: ClassVar[bool] = True  # whether its model output can generate (reward models cannot)
    EVAL_INPUT: ClassVar[str | None] = None  # the model field this stage changes: its baseline for deltas and gates
    # model fields whose greedy held-out numbers the stage reports, under a label (distillation:
    # student -> before/, teacher -> teacher/); an upstream stage's evaluation of that model serves
    REFERENCE_EVALS: ClassVar[dict[str, str]] = {}

    def semantic_errors(self) -> list[tuple[tuple, str]]:
        """Checks beyond field types, run at validation before anything starts: (path, message)."""
        return [((f, "source"), "preference pairs come from a stage's `pairs` output or a local file "
                 "({path: pairs.jsonl, columns: {...}})") for f in self.PAIRS_FIELDS
                if (spec := getattr(self, f)) is not None and not spec.stage_ref and spec.source != "file"]

    def input_fingerprints(self) -> dict[str, str]:
        """Content fingerprints of inputs that are not MODEL_FIELDS / DATA_FIELDS (cache key)."""
        return {}

    def model_inputs(self) -> dict[str, str]:
        """Every model input by its field path ("model", "models.1"); the flow resolves each."""
        out = {}
        for f in self.MODEL_FIELDS:
            value = getattr(self, f)
            if isinstance(value, list):
                out.update({f"{f}.{i}": v for i, v in enumerate(value)})
            elif value:
                out[f] = value
        return out

    def data_inputs(self) -> dict[str, DataSpec]:
        """Every dataset input by its field path ("data", "mix.0.data"); the flow resolves each."""
        return {f: spec for f in self.DATA_FIELDS + self.PAIRS_FIELDS if (spec := getattr(self, f)) is not None}

    def refs(self) -> list[tuple[str, str, str]]:
        """(field path, reference, wanted output) for every input that names an earlier stage."""
        out = []
        for path, ref in self.model_inputs().items():
            if "." in ref and "/" not in ref and ref.split(".", 1)[1] in ("model", "dataset", "pairs"):
                out.append((path, ref, "model"))
        for path, spec in self.data_inputs().items():
            if spec.stage_ref:
                wanted = "pairs" if path.split(".")[0] in self.PAIRS_FIELDS else "dataset"
                out.append((f"{path}.source", spec.stage_ref, wanted))
        return out


def field_loc(path: str) -> tuple:
    """A dotted field path as a location tuple: "mix.0.data" -> ("mix", 0, "data")."""
    return tuple(int(p) if p.isdigit() else p for p in path.split("."))


class TrainingKnobs(Strict):
    """The optimisation fields every trainer-backed stage shares."""
    max_steps: int = Field(100, ge=1, le=10_000_000, description="optimizer steps (at most 10 million: a bigger "
                           "number is a typo, not a plan)")
    learning_rate: float = Field(1e-5, gt=0)
    lr_scheduler: str = "cosine"
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    per_device_batch_size: int = Field(4, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    max_length: int = Field(1024, ge=16)
    save_steps: int = Field(50, ge=1, description="checkpoint interval; a killed stage resumes here")
    logging_steps: int = Field(1, ge=1)
    seed: int = 42
    bf16: bool = False
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    lora: LoraSpec | None = None
