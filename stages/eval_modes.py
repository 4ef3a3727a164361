"""Evaluation per thinking mode and per thinking budget (Qwen3): how accuracy changes when the
model is told /think or /no_think, and as its thinking budget shrinks.

- modes: each held-out prompt gets the mode's flag on its last user turn; greedy decoding. Per mode:
  accuracy, mode compliance (think: a think block with thinking in it; no_think: the empty block
  `<think>\\n\\n</think>`), language consistency rate (completions with at least 95% of their words
  in the row's language) and mean answer length in tokens. With both modes, the paired change
  think - no_think on the same prompts.
- answers are read where the recipe's rules put them (EvalSpec.answer_rules): never inside the
  thinking, so a completion cut mid-thought scores 0 whatever numbers its thinking mentions.
- budgets: the prompts as they are (thinking is the default), greedy, with the thinking budget
  (toolkit.rollouts; 0 = no-think, None = unlimited). Per budget: accuracy, mean thinking tokens and
  the share of completions whose thinking was cut. `budget_curve.png` plots accuracy against budget,
  with the no-think accuracy as a reference line when `no_think` is among the modes.
"""

from __future__ import annotations

from pathlib import Path

from toolkit.core.files import save_figure
from toolkit.core.language import consistency
from toolkit.core.stats import paired_change, rate_interval
from toolkit.core.text import split_thinking
from toolkit.core.thinking import complies, flag_messages
from toolkit.rewards.verifiers import score_rows
from toolkit.rollouts import Completion, Engine, SamplingSpec

CONSISTENT = 0.95
THINK_GAIN = "eval/mode/think_minus_no_think/"
BUDGET_STEP = "eval/budget_step/"  # each budget against the next smaller one, paired


def mean_defined(values) -> float:
    """Mean of the values that are not None; 0 when there are none."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else 0.0


def with_interval(out: dict[str, float], name: str, summary: dict[str, float]) -> None:
    """A metric with its 95% interval (`_lo`, `_hi`) and the count it was judged on (`_n`)."""
    out[name] = summary["mean"]
    out.update({f"{name}_lo": summary["lo"], f"{name}_hi": summary["hi"], f"{name}_n": summary["n"]})


def _consistent(text: str, language: str) -> float | None:
    share = consistency(text, language or "en")
    return None if share is None else float(share >= CONSISTENT)


def mode_metrics(engine: Engine, rows: list[dict], spec, modes: list[str]) -> dict[str, float]:
    """Per mode, and with both modes the paired change think - no_think on the same prompts
    (`eval/mode/think_minus_no_think/accuracy` with its interval, n and McNemar p): Qwen3's claim
    that thinking helps is a comparison of one model's two modes, prompt by prompt."""
    out: dict[str, float] = {}
    scores: dict[str, list[float | None]] = {}
    for mode in modes:
        prompts = [flag_messages(r["prompt"], mode) for r in rows]
        done = [c[0] for c in engine.complete(
            prompts, SamplingSpec(max_new_tokens=spec.max_new_tokens, batch_size=spec.batch_size),
            progress=f"mode {mode}")]
        texts = [c.text for c in done]
        answers = [split_thinking(t)[1] for t in texts]
        prefix = f"eval/mode/{mode}/"
        scores[mode] = score_rows(rows, texts, **spec.answer_rules())
        with_interval(out, prefix + "accuracy", rate_interval(scores[mode]))
        out[prefix + "mode_compliance"] = mean_defined([float(complies(c.text, mode, cut=not c.finished)) for c in done])
        out[prefix + "language_consistency"] = mean_defined([_consistent(t, r["language"]) for t, r in zip(texts, rows)])
        out[prefix + "answer_tokens_mean"] = mean_defined([len(engine.tokenizer(a, add_special_tokens=False)["input_ids"])
                                                    for a in answers])
    if {"think", "no_think"} <= set(scores):
        change = paired_change(scores["no_think"], scores["think"])
        out[f"{THINK_GAIN}accuracy"] = change.pop("delta")
        out.update({f"{THINK_GAIN}accuracy_{k}": v for k, v in change.items()})
    return out


def budget_label(budget: int | None) -> str:
    return "unlimited" if budget is None else str(budget)


def budget_metrics(engine: Engine, rows: list[dict], spec, budgets: list[int | None],
                   unlimited: list[Completion] | None = None) -> dict[str, float]:
    """`unlimited`: the greedy pass's completions when they are what budget None would generate (the
    chat prompts as they are, the same token limit). That pass is then not run twice, and the other
    budgets are derived from it, generating only the rows whose budget ran out
    (`Engine.complete_budgeted`: a qwen3 demo evaluation's budget 64 continues a few dozen rows
    instead of generating 200)."""
    out: dict[str, float] = {}
    prompts = [r["prompt"] for r in rows]
    scores: dict[int | None, list[float | None]] = {}
    for budget in budgets:
        sampling = SamplingSpec(max_new_tokens=spec.max_new_tokens, batch_size=spec.batch_size,
                                thinking_budget=budget, answer_max_new_tokens=spec.answer_max_new_tokens,
                                stop_thinking=spec.stop_thinking)
        label = f"budget {budget_label(budget)}"
        if unlimited is None:
            done = [c[0] for c in engine.complete(prompts, sampling, progress=label)]
        elif budget is None:
            done = unlimited
        else:
            done = [c[0] for c in engine.complete_budgeted(prompts, sampling, unlimited, progress=label)]
        prefix = f"eval/budget/{budget_label(budget)}/"
        scores[budget] = score_rows(rows, [c.text for c in done], **spec.answer_rules())
        with_interval(out, prefix + "accuracy", rate_interval(scores[budget]))
        thinking = [c.thinking_tokens if c.thinking_tokens is not None else
                    len(engine.tokenizer(split_thinking(c.text)[0] or "", add_special_tokens=False)["input_ids"])
                    for c in done]
        out[prefix + "thinking_tokens_mean"] = mean_defined(thinking)
        out[prefix + "truncated_share"] = mean_defined([float(c.budget_hit) for c in done])
        if budget == 0:  # the template closed the think block in the prompt: a `</think>` in the answer
            # means the model thought anyway (qwen3's tenth demo run: 197 of 200), and budget 0 is no
            # longer a no-thinking point of the curve
            out[prefix + "thought_anyway_share"] = mean_defined([float("</think>" in c.text) for c in done])
    # Qwen3's claim is that accuracy does not fall as the budget grows: each step up, paired on the
    # same prompts (`eval/budget_step/16_minus_0/accuracy` with its interval, n and McNemar p), beside
    # `eval/budget/<b>/` rather than in it, so whatever reads the budgets there reads only budgets
    ordered = sorted(scores, key=lambda b: float("inf") if b is None else b)
    for low, high in zip(ordered, ordered[1:]):
        change = paired_change(scores[low], scores[high])
        name = f"{BUDGET_STEP}{budget_label(high)}_minus_{budget_label(low)}/accuracy"
        out[name] = change.pop("delta")
        out.update({f"{name}_{k}": v for k, v in change.items()})
    return out


def plot_budget_curve(metrics: dict[str, float], budgets: list[int | None], unlimited_at: int, path: Path) -> None:
    """Accuracy against thinking budget; `unlimited` is drawn at `unlimited_at` tokens."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sorted((unlimited_at if b is None else b, metrics[f"eval/budget/{budget_label(b)}/accuracy"])
                    for b in budgets)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label="thinking, with budget")
    if "eval/mode/no_think/accuracy" in metrics:
        ax.axhline(metrics["eval/mode/no_think/accuracy"], linestyle="--", color="gray", label="/no_think")
    ax.set_xlabel(f"thinking budget (tokens; unlimited drawn at {unlimited_at})")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="lower right")
    save_figure(fig, path)
