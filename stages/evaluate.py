"""The evaluation every model-producing stage ends with, so stages line up in MLflow's compare view.

Greedy decoding on the recipe's held-out eval set (the same prompts for every stage), scored by the
row's verifier, with answers read where the recipe's rules put them (`EvalSpec.answer_rules`);
optionally `samples` sampled completions per prompt at the R1 paper's evaluation settings
(temperature 0.6, top-p 0.95) for pass@1 and pass@k (Chen et al.'s unbiased estimator) and, for math,
maj@k, logged as `eval/pass_at_1`, `eval/pass_at_<k>`, `eval/maj_at_<k>` (MLflow refuses `@` in a
name); optionally accuracy per thinking mode and per thinking budget, with a budget curve
(stages/eval_modes.py).

Every rate carries its 95% Wilson interval and every mean a bootstrap one (`<metric>_lo`, `_hi`, and
`<metric>_n`, the prompts it was judged on; toolkit.core.stats), and the per-prompt scores are kept
(`Evaluation.scores`) so that two models can be compared on the same prompts (pipeline.gates).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import Field, field_validator, model_validator

from stages.common import REWARD_SCORES, DataSpec, GenerationSpec, RewardSpec, Strict
from stages.eval_modes import budget_metrics, mean_defined, mode_metrics, plot_budget_curve, with_interval
from toolkit.core.files import write_json_atomic
from toolkit.core.stats import majority_correct, mean_interval, pass_at_k, rate_interval
from toolkit.core.templates import CHAT_TEMPLATES, check_template, render_prompt
from toolkit.core.text import answer_region, extract_answer, is_well_formed, split_thinking
from toolkit.core.thinking import STOP_THINKING
from toolkit.rewards import combined, distinct_names, get_reward, reward_counter_metrics, reward_stats
from toolkit.rewards.verifiers import score_rows
from toolkit.rollouts import SamplingSpec


class EvalSpec(Strict):
    data: DataSpec = Field(default_factory=lambda: DataSpec(source="synthetic_math", split="eval", n=32))
    max_new_tokens: int = Field(256, ge=1)
    batch_size: int = Field(16, ge=1)
    samples: int = Field(0, ge=0, description="sampled completions per prompt for pass@k; 0 = greedy only")
    temperature: float = Field(0.6, gt=0)
    top_p: float = Field(0.95, gt=0, le=1)
    table_rows: int = Field(8, ge=0, description="sample generations logged as a table")
    rewards: list[RewardSpec] = Field(default_factory=list, description="rewards also scored on the greedy outputs")
    template: str = Field("chat", description="prompt template (toolkit.core.templates): chat, r1_zero or a {prompt} string")
    modes: list[Literal["think", "no_think"]] = Field(default_factory=list, description="accuracy per thinking "
                                                      "mode, the prompts flagged /think or /no_think")
    budgets: list[int | None] = Field(default_factory=list, description="thinking budgets in tokens (0 = no-think, "
                                      "null = unlimited): accuracy per budget and budget_curve.png")
    answer_max_new_tokens: int | None = Field(None, ge=1, description="with budgets: tokens for the answer after "
                                              "the thinking; default max_new_tokens")
    stop_thinking: str = Field(STOP_THINKING, description="the string a budget inserts (Qwen's usage docs)")
    generation: GenerationSpec = Field(default_factory=GenerationSpec, description="the engine and precision "
                                       "every evaluated model samples with (one setting, so stages compare)")

    @field_validator("template")
    @classmethod
    def _known_template(cls, value: str) -> str:
        if msg := check_template(value):
            raise ValueError(msg)
        return value

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, value: list[int | None]) -> list[int | None]:
        if any(b is not None and b < 0 for b in value):
            raise ValueError("budgets are 0 or more tokens (null = unlimited)")
        return value

    def answer_rules(self) -> dict:
        """Where held-out answers are read, for every evaluation path (greedy, samples, modes,
        budgets, baselines): the eval's own `accuracy_math` options when it lists that reward, else
        the template's (`<answer>` tags for r1_zero), and never inside the thinking (after_think
        None: after `</think>` when the completion thinks)."""
        accuracy = next((r.params for r in self.rewards if r.name == "accuracy_math"), {})
        return {"answer_tags": accuracy.get("answer_tags", self.template == "r1_zero"),
                "after_think": accuracy.get("after_think") or None}

    @model_validator(mode="after")
    def _modes_need_chat(self):
        if (self.modes or self.budgets) and self.template not in CHAT_TEMPLATES:
            raise ValueError(f"modes and budgets need a chat template (flags go in the user turn), not {self.template!r}")
        return self


def score_rewards(specs: list[RewardSpec], rows: list[dict], completions: list[str],
                  completion_ids: list[list[int]] | None = None,
                  max_length: int | None = None) -> tuple[dict[str, float], dict[str, list]]:
    """Each reward's mean (with its 95% bootstrap interval and n), std and None count, its counters,
    and the weighted combination's mean; and each reward's per-prompt values (`reward/<name>`),
    which `pipeline.gates.change_metrics` pairs between two models. Rewards are keyed by the name
    training logs them under (`reward_model_full`, `reward_model_answer`; a repeated name gets
    `_2`: toolkit.rewards.distinct_names). Length rewards measure `completion_ids` (tokens), as in
    training."""
    columns = {"answer": [r["answer"] for r in rows], "language": [r["language"] for r in rows]}
    prompts = [r["prompt"] for r in rows]
    rewards = distinct_names([get_reward(s.name, max_length, **s.params) for s in specs])
    values = {reward.__name__: reward(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
              for reward in rewards}
    out: dict[str, float] = {}
    for name, v in values.items():
        out.update({f"eval/{k}": x for k, x in reward_stats(name, v).items()})
        with_interval(out, f"eval/rewards/{name}/mean", mean_interval(v))
    out.update(reward_counter_metrics(rewards, "eval/"))
    out["eval/rewards/combined/mean"] = mean_defined(combined(values, {r.__name__: s.weight for r, s in zip(rewards, specs)}))
    return out, {f"{REWARD_SCORES}{name}": v for name, v in values.items()}


EVAL_SCORES = "eval_scores.json"  # a stage's per-prompt held-out scores, beside its result.json
INPUT_EVAL_SCORES = "input_eval_scores.json"  # its input model's, when the worker measured them


class Evaluation(NamedTuple):
    metrics: dict[str, float]
    table: list[dict]  # sample generations for the MLflow table
    scores: dict[str, list]  # per prompt, in row order: id, accuracy, format, tokens (pass_at_1 with samples,
    # reward/<name> with rewards)


def sampled_metrics(rows: list[dict], sampled: list[list[str]],
                    spec: EvalSpec) -> tuple[dict[str, float], list[float | None]]:
    """pass@1 and pass@k (unbiased, Chen et al. 2021) over `spec.samples` samples per prompt; maj@k
    for math rows (the most common extracted answer). Also each prompt's pass@1 (its share of
    correct samples; None when no sample could be judged), in row order, for paired changes."""
    rules = spec.answer_rules()
    per_row = [score_rows([row] * len(cs), cs, **rules) for row, cs in zip(rows, sampled)]
    judged = [(row, cs, s) for row, cs, s in zip(rows, sampled, per_row) if any(x is not None for x in s)]
    k = spec.samples
    pass1 = [pass_at_k(len(s), sum(x == 1.0 for x in s), 1) if any(x is not None for x in s) else None
             for s in per_row]
    out: dict[str, float] = {}
    with_interval(out, "eval/pass_at_1", mean_interval([p for p in pass1 if p is not None]))
    if k > 1:
        with_interval(out, f"eval/pass_at_{k}", mean_interval(
            [pass_at_k(len(s), sum(x == 1.0 for x in s), k) for _, _, s in judged]))
    majority = []
    for row, cs, s in judged:
        if row["verifier"] == "math":
            answers = [extract_answer(r) if (r := answer_region(c, rules["answer_tags"], rules["after_think"]))
                       else None for c in cs]
            majority.append(majority_correct(answers, s))
    if majority:
        with_interval(out, f"eval/maj_at_{k}", rate_interval([m if m is not None else 0.0 for m in majority]))
    return out, pass1


def evaluate(model_dir: str, spec: EvalSpec, rows: list[dict], trust_remote_code: bool = False,
             out_dir: Path | None = None) -> Evaluation:
    """Metrics with intervals, the sample table, and per-prompt scores; plots (budget_curve.png) go
    into `out_dir`."""
    engine = spec.generation.open(model_dir, trust_remote_code)
    tokenizer = engine.tokenizer
    prompts = [render_prompt(spec.template, r) for r in rows]
    done = [c[0] for c in engine.complete(prompts, SamplingSpec(max_new_tokens=spec.max_new_tokens,
                                                                batch_size=spec.batch_size), progress=True)]
    greedy = [c.text for c in done]
    counters: dict[str, float] = {}
    scores = score_rows(rows, greedy, counters, **spec.answer_rules())
    formats = [1.0 if is_well_formed(c, answer_tags=spec.template == "r1_zero") else 0.0 for c in greedy]
    thinking = [split_thinking(c)[0] for c in greedy]
    n_tokens = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
    # what the engine generated, the end token included (TRL's completion length counts it too): the
    # text encoded again drops that token and can come back shorter (empty, on the tiny model)
    tokens = [c.tokens for c in done]
    metrics = {"eval/unjudged": float(sum(s is None for s in scores)), "eval/n": float(len(rows))}
    with_interval(metrics, "eval/accuracy", rate_interval(scores))
    with_interval(metrics, "eval/format_rate", rate_interval(formats))
    with_interval(metrics, "eval/completion_tokens_mean", mean_interval(tokens))
    with_interval(metrics, "eval/thinking_tokens_mean", mean_interval([n_tokens(t) for t in thinking if t is not None]))
    metrics.update({f"eval/{k}": v for k, v in counters.items()})
    reward_scores: dict[str, list] = {}
    if spec.rewards:
        # the ids the engine generated, end token included, as TRL passes them in training: text
        # decoded and encoded again can come back shorter, and a thought cut at the limit would not
        # read as cut (thinking_flag)
        reward_metrics, reward_scores = score_rewards(spec.rewards, rows, greedy, [c.ids for c in done], spec.max_new_tokens)
        metrics.update(reward_metrics)
    if spec.samples:
        sampled = engine.texts(prompts, SamplingSpec(
            max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, top_p=spec.top_p,
            n=spec.samples, batch_size=max(1, spec.batch_size // spec.samples)), progress=True)
        sampled_out, pass1 = sampled_metrics(rows, sampled, spec)
        metrics.update(sampled_out)
    if spec.modes:
        metrics.update(mode_metrics(engine, rows, spec, spec.modes))
    if spec.budgets:
        # Budget None on the chat prompts as they are is this greedy pass, token for token.
        metrics.update(budget_metrics(engine, rows, spec, spec.budgets, done if spec.template == "chat" else None))
        if out_dir is not None:
            plot_budget_curve(metrics, spec.budgets, spec.max_new_tokens, out_dir / "budget_curve.png")
    table = [{"id": r["id"], "prompt": r["prompt"][-1]["content"], "gold": r["answer"], "completion": c,
              "score": s} for r, c, s in list(zip(rows, greedy, scores))[:spec.table_rows]]
    per_prompt = {"id": [r["id"] for r in rows], "accuracy": scores, "format": formats, "tokens": tokens, **reward_scores}
    if spec.samples:
        per_prompt["pass_at_1"] = pass1
    return Evaluation(metrics, table, per_prompt)


SWEEP_PREFIXES = ("eval/mode/", "eval/budget/", "eval/budget_step/", "eval/pass_at_", "eval/maj_at_")


def reference_spec(spec: EvalSpec, gate_metric: str | None = None) -> EvalSpec:
    """The evaluation a reference model gets (a stage's input model as its baseline, a distillation
    teacher): the greedy pass only, which is what paired changes and the before/teacher numbers
    read. The sweeps (sampled pass@k, modes, budgets) describe the stage's own model; run on every
    reference they would double an evaluation's cost (a qwen3 demo model: 7 passes over the set
    instead of 1). Kept when the stage gates on a sweep metric, which then needs the input's value."""
    if gate_metric is not None and gate_metric.startswith(SWEEP_PREFIXES):
        return spec
    return spec.model_copy(update={"samples": 0, "modes": [], "budgets": []})


def evaluate_once(model_dir: str, spec: EvalSpec, rows: list[dict], trust_remote_code: bool = False,
                  cache: Path | None = None) -> Evaluation:
    """A model's held-out evaluation (metrics and per-prompt scores), read from `cache` when an
    earlier stage or run measured it (the plan's baseline file: one per model and evaluation spec),
    else measured and cached."""
    if cache is not None and cache.exists():
        saved = json.loads(cache.read_text())
        return Evaluation(saved["metrics"], [], saved["scores"])
    done = evaluate(model_dir, spec, rows, trust_remote_code)
    if cache is not None:
        write_json_atomic(cache, {"metrics": done.metrics, "scores": done.scores})
    return done
