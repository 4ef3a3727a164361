"""Numbers you can trust: intervals against known values, the paired test against hand-computed
cases, pass@k against the closed form, answers read where the recipe's rules put them, and gates
that ask for a significant change."""

import itertools
import json
import math
import random

import pytest

from pipeline.gates import change_metrics, gate_failure
from stages.common import GateSpec
from stages.evaluate import EvalSpec
from toolkit.core.stats import (
    bootstrap_mean,
    majority_correct,
    mcnemar_exact,
    newcombe_paired,
    paired_change,
    pass_at_k,
    rate_interval,
    significant,
    wilson,
)
from toolkit.rewards.verifiers import score_rows


def test_wilson_matches_known_values():
    # Wilson (1927) / Newcombe (1998) table values at 95%
    assert wilson(8, 16) == pytest.approx((0.2800, 0.7200), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson(10, 10)[1] == pytest.approx(1.0) and wilson(0, 0) == (0.0, 1.0)
    half = (wilson(100, 200)[1] - wilson(100, 200)[0]) / 2
    assert half == pytest.approx(0.0685, abs=1e-3)  # why the demo needs ~200 prompts for +-7 points


def test_bootstrap_interval_of_a_mean_covers_it_and_shrinks_with_n():
    values = [float(i % 7) for i in range(50)]
    lo, hi = bootstrap_mean(values)
    assert lo < sum(values) / len(values) < hi
    lo4, hi4 = bootstrap_mean(values * 4)
    assert hi4 - lo4 < hi - lo
    assert bootstrap_mean(values) == (lo, hi)  # seeded: reproducible
    assert rate_interval([0.5, 1.0, None, 0.0])["n"] == 3  # fractions: bootstrap; None left out


def test_mcnemar_exact_matches_a_hand_computed_case():
    # 10 prompts gained, 2 lost: 2 * P(X <= 2), X ~ Binomial(12, 1/2) = 2 * (1 + 12 + 66) / 4096
    assert mcnemar_exact(10, 2) == pytest.approx(158 / 4096)
    assert mcnemar_exact(2, 10) == mcnemar_exact(10, 2)
    assert mcnemar_exact(5, 5) == 1.0 and mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64)


def test_paired_change_uses_only_the_pairs_and_reports_mcnemar():
    before = [0, 0, 1, 1, 0, 0, 0, 0, 0, 0, None]
    after = [1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 1]
    c = paired_change(before, after)
    assert c["n"] == 10 and c["delta"] == pytest.approx(0.5)
    assert c["lo"] > 0 and c["hi"] <= 1
    assert c["p"] == pytest.approx(mcnemar_exact(5, 0))
    same = paired_change([1, 0] * 20, [0, 1] * 20)  # as many gained as lost: no change
    assert same["delta"] == 0 and same["lo"] < 0 < same["hi"] and same["p"] == 1.0
    assert "p" not in paired_change([10.0, 12.0], [8.0, 9.0])  # lengths: no McNemar


def test_few_discordant_pairs_are_not_called_a_change():
    """4 prompts lost and none gained of 200: McNemar's p is 0.125, and the interval holds 0 too (a
    paired bootstrap said [-0.040, -0.005] here)."""
    c = paired_change([1] * 4 + [0] * 196, [0] * 200)
    assert c["p"] == pytest.approx(0.125) and c["lo"] < 0 < c["hi"] and not significant(c)
    assert significant(paired_change([0] * 200, [1] * 12 + [0] * 188))  # 12 gained, none lost: p = 0.0005


def test_the_paired_interval_covers_the_true_change_95_percent_of_the_time():
    rng = random.Random(7)
    for both, lost, gained in [(0.1, 0.02, 0.05), (0.0, 0.01, 0.01), (0.3, 0.08, 0.02)]:
        covered = 0
        for _ in range(400):
            cells = [0, 0, 0, 0]
            for _ in range(200):
                u = rng.random()
                cells[0 if u < both else 1 if u < both + lost else 2 if u < both + lost + gained else 3] += 1
            lo, hi = newcombe_paired(*cells)
            covered += lo <= gained - lost <= hi
        assert 0.92 <= covered / 400 <= 1.0, (both, lost, gained, covered)


@pytest.mark.parametrize("n,c,k", [(10, 3, 1), (10, 3, 5), (8, 0, 3), (6, 6, 2), (7, 2, 7)])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    # closed form: the share of k-subsets of the n samples with at least one correct one
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_majority_vote():
    assert majority_correct(["7", "7", "8"], [1.0, 1.0, 0.0]) == 1.0
    assert majority_correct(["8", "7", "8"], [0.0, 1.0, 0.0]) == 0.0
    assert majority_correct([None, None], [0.0, 0.0]) is None


MATH = {"verifier": "math", "answer": "7"}
CUT_MID_THOUGHT = "<think>\n3 + 4 = \\boxed{7}, so the answer is 7 and"
ANSWER_IN_THINKING = "<think>\\boxed{7}</think>\n\nI am not sure."
RIGHT = "<think>\n3 + 4\n</think>\n\n\\boxed{7}"
NO_THINKING = "3 + 4 = 7, so \\boxed{7}"


@pytest.mark.parametrize("spec", [EvalSpec(), EvalSpec(modes=["think", "no_think"], budgets=[0, None]),
                                  EvalSpec(rewards=[{"name": "accuracy_math", "params": {"after_think": True}}])],
                         ids=["stage", "modes_and_budgets", "eval_reward_after_think"])
def test_held_out_answers_are_never_read_inside_the_thinking(spec):
    """Every evaluation path (greedy, samples, modes, budgets, baselines) scores with these rules."""
    scores = score_rows([MATH] * 4, [CUT_MID_THOUGHT, ANSWER_IN_THINKING, RIGHT, NO_THINKING], **spec.answer_rules())
    assert scores[:3] == [0.0, 0.0, 1.0]
    assert scores[3] == (0.0 if spec.rewards else 1.0)  # a model that does not think is read whole by default


def test_r1_zero_evaluation_reads_the_answer_tags():
    rules = EvalSpec(template="r1_zero").answer_rules()
    assert rules["answer_tags"]
    texts = ["<think>7</think> <answer>8</answer>", "<think>so</think> <answer>7</answer>"]
    assert score_rows([MATH] * 2, texts, **rules) == [0.0, 1.0]


def scores_file(ids, accuracy):
    return {"id": ids, "accuracy": accuracy, "format": [1.0] * len(ids), "tokens": [10] * len(ids)}


def test_changes_are_paired_by_prompt_id():
    before = scores_file(["a", "b", "c", "d"], [0.0, 0.0, 1.0, 0.0])
    after = scores_file(["d", "c", "b", "a", "z"], [1.0, 1.0, 1.0, 1.0, 0.0])  # another order, one extra prompt
    m = change_metrics(after, before)
    assert m["change/eval/accuracy"] == pytest.approx(0.75) and m["change/eval/accuracy_n"] == 4
    assert m["change/eval/accuracy_p"] == pytest.approx(mcnemar_exact(3, 0))
    assert m["change/eval/format_rate"] == 0 and m["change/eval/completion_tokens_mean"] == 0


def test_each_reward_both_evaluations_scored_is_paired_by_prompt():
    """An evaluation's rewards (a reward model's score, say) change between two models as a paired
    bootstrap over the prompts both scored: `change/eval/rewards/<name>/mean`, no McNemar."""
    before = {**scores_file(["a", "b", "c"], [0.0, 1.0, 0.0]), "reward/reward_model_full": [1.0, 2.0, None],
              "reward/reward_model_answer": [0.0, 0.0, 0.0]}
    after = {**scores_file(["c", "b", "a"], [0.0, 1.0, 0.0]), "reward/reward_model_full": [9.0, 2.5, 2.0]}
    m = change_metrics(after, before)
    assert m["change/eval/rewards/reward_model_full/mean"] == pytest.approx((1.0 + 0.5) / 2)  # c: unscored before
    assert m["change/eval/rewards/reward_model_full/mean_n"] == 2
    assert m["change/eval/rewards/reward_model_full/mean_lo"] == pytest.approx(0.5)
    assert "change/eval/rewards/reward_model_full/mean_p" not in m
    assert not any("reward_model_answer" in k for k in m)  # scored on one side only


def test_sampled_pass_at_1_is_kept_per_prompt_and_paired_only_where_both_sampled():
    """The R1 paper's protocol (k samples at T 0.6, pass@1 = mean correctness) as a paired change:
    each prompt's share of correct samples, compared by prompt id; a greedy-only side has none."""
    from stages.evaluate import sampled_metrics

    rows = [dict(MATH, id="a"), dict(MATH, id="b")]
    texts = [["\\boxed{7}", "\\boxed{7}", "\\boxed{8}", "\\boxed{7}"], ["\\boxed{1}"] * 4]
    metrics, pass1 = sampled_metrics(rows, texts, EvalSpec(samples=4))
    assert pass1 == [0.75, 0.0] and metrics["eval/pass_at_1"] == pytest.approx(0.375)
    before = {**scores_file(["a", "b"], [1.0, 0.0]), "pass_at_1": pass1}
    after = {**scores_file(["b", "a"], [0.0, 1.0]), "pass_at_1": [0.5, 1.0]}
    m = change_metrics(after, before)
    assert m["change/eval/pass_at_1"] == pytest.approx((0.25 + 0.5) / 2) and m["change/eval/pass_at_1_n"] == 2
    assert "change/eval/pass_at_1_p" not in m  # shares, not 0/1 scores: a paired bootstrap, no McNemar
    assert "change/eval/pass_at_1" not in change_metrics(scores_file(["a", "b"], [1.0, 1.0]), before)


def test_a_gate_can_ask_for_a_significant_change():
    strict = GateSpec(metric="accuracy", min_delta=0.0, significant=True)
    noisy = {"eval/accuracy": 0.6, "input/eval/accuracy": 0.5, "change/eval/accuracy": 0.1,
             "change/eval/accuracy_lo": -0.05, "change/eval/accuracy_hi": 0.25, "change/eval/accuracy_n": 40}
    assert gate_failure("rl", GateSpec(metric="accuracy"), noisy) is None  # the plain gate passes on noise
    assert "not significantly above" in gate_failure("rl", strict, noisy)
    real = {**noisy, "change/eval/accuracy_lo": 0.02}
    assert gate_failure("rl", strict, real) is None
    assert "needs a paired comparison" in gate_failure("rl", strict, {"eval/accuracy": 0.6, "input/eval/accuracy": 0.5})
    with pytest.raises(ValueError, match="compared prompt by prompt"):
        GateSpec(metric="eval/mode/think/accuracy", significant=True)


def test_compare_prints_changes_with_intervals_and_marks_significant_ones():
    from pipeline.store.runs import comparison, format_comparison

    metrics = {"eval/accuracy": 0.8, "eval/accuracy_lo": 0.6, "eval/accuracy_hi": 0.9, "eval/accuracy_n": 20,
               "input/eval/accuracy": 0.4, "change/eval/accuracy": 0.4, "change/eval/accuracy_lo": 0.2,
               "change/eval/accuracy_hi": 0.6, "change/eval/accuracy_n": 20, "change/eval/accuracy_p": 0.002}
    record = {"id": "r", "recipe": "x", "stages": [{"name": "rl", "kind": "grpo", "status": "completed",
                                                    "metrics": metrics}]}
    rows = comparison([record])
    assert rows[0]["paired"]["eval/accuracy"]["significant"] and rows[0]["change"]["eval/accuracy"] == pytest.approx(0.4)
    text = format_comparison(rows)
    assert "0.8 [0.6, 0.9]" in text and "+0.4 [+0.2, +0.6]*" in text
    assert "accuracy_lo" not in text  # intervals sit inside their metric's cell
    json.dumps(rows)


def test_candidate_moves_only_to_a_version_not_significantly_worse(tmp_path):
    """The registry's `candidate` is what a user deploys: a new version takes it unless its held-out
    accuracy on the same prompts is significantly below the current candidate's."""
    import json

    from pipeline.gates import candidate_refusal
    from stages.evaluate import EVAL_SCORES

    def output(name: str, accuracy: list[float]):
        out = tmp_path / name
        out.mkdir()
        (out / EVAL_SCORES).write_text(json.dumps({"id": [f"q{i}" for i in range(len(accuracy))], "accuracy": accuracy,
                                                   "format": accuracy, "tokens": [10.0] * len(accuracy)}))
        return out

    strong = output("strong", [1.0] * 60 + [0.0] * 40)
    weak = output("weak", [0.0] * 100)  # the distilled student that scores 0
    close = output("close", [1.0] * 58 + [0.0] * 42)
    refusal = candidate_refusal(weak, strong)
    assert refusal and "held-out accuracy -0.600" in refusal and "100 prompts" in refusal
    assert candidate_refusal(close, strong) is None  # within noise of the candidate: it may move
    assert candidate_refusal(strong, weak) is None and candidate_refusal(weak, None) is None
    assert candidate_refusal(weak, output("unscored", [])) is None  # nothing shared to compare on


def test_reference_models_get_the_greedy_pass_only_unless_a_gate_reads_a_sweep():
    """An input model's baseline and a distillation teacher are read for their greedy numbers; the
    sweeps (pass@k samples, modes, budgets) stay with the stage's own model, except when the stage's
    gate compares a sweep metric, which then needs the input's value too."""
    from stages.evaluate import reference_spec

    spec = EvalSpec(samples=4, modes=["think", "no_think"], budgets=[0, 16, None], max_new_tokens=80)
    reference = reference_spec(spec)
    assert (reference.samples, reference.modes, reference.budgets) == (0, [], [])
    sweeps = {"samples", "modes", "budgets"}
    assert reference.model_dump(exclude=sweeps) == spec.model_dump(exclude=sweeps)
    assert reference_spec(spec, "eval/accuracy") == reference
    assert reference_spec(spec, "eval/mode/think/accuracy") == spec
    assert reference_spec(spec, "eval/budget/16/accuracy") == spec


def test_a_baseline_is_keyed_by_the_passes_it_runs():
    """Two stages on the same input model share its baseline only when they ask for the same passes:
    a stage gating on a mode metric gets the sweeps, and its own cache file, so a greedy-only baseline
    written first can never be read as one that measured the mode."""
    from pipeline.gates import baseline_plan
    from pipeline.recipe import load_recipe
    from stages.common import GateSpec

    recipe = load_recipe("qwen3", "tiny").recipe
    fusion = next(s for s in recipe.stages if s.name == "fusion")
    eval_spec, fingerprints = recipe.eval.model_dump(mode="json"), {"model": "m", "eval_data": "d"}
    greedy = baseline_plan(fusion, eval_spec, fingerprints, {})
    assert greedy["eval"]["modes"] == [] and greedy["eval"]["budgets"] == []
    gated = baseline_plan(fusion.model_copy(update={"gate": GateSpec(metric="eval/mode/think/accuracy")}),
                          eval_spec, fingerprints, {})
    assert gated["eval"]["modes"] == eval_spec["modes"] and gated["path"] != greedy["path"]


def test_a_distillation_reuses_the_upstream_evaluations_of_its_student_and_teacher():
    """qwen3's distill_on: its teacher (general_rl's model) and its student (distill_off's model)
    were evaluated by the stages that made them; the worker does not evaluate them again, and the
    stage still reports before/ and teacher/ numbers, the upstream's greedy ones (not its sweeps)."""
    from pipeline.gates import reference_metrics, reused_evaluations
    from pipeline.recipe import load_recipe
    from stages.contracts import StageResult

    stages = {s.name: s for s in load_recipe("qwen3", "tiny").recipe.stages}

    def result(name: str, metrics: dict) -> StageResult:
        return StageResult(name=name, kind="x", cache_key="k", output_dir="/nowhere", mlflow_run_id=None,
                           outputs={"model": "model"}, metrics=metrics, fingerprints={"model": name})

    upstream = {"general_rl": result("general_rl", {"eval/accuracy": 0.3, "eval/mode/think/accuracy": 0.21}),
                "distill_off": result("distill_off", {"eval/accuracy": 0.0, "train/loss": 1.0})}
    assert reused_evaluations(stages["distill_on"], upstream) == ["student", "teacher"]
    assert reference_metrics(stages["distill_on"], upstream) == {"before/eval/accuracy": 0.0, "teacher/eval/accuracy": 0.3}
    # distill_off's student is the profile's student model, not a stage's: it is evaluated as before
    assert reused_evaluations(stages["distill_off"], upstream) == ["teacher"]
    # an upstream stage that was not evaluated serves nothing
    upstream["general_rl"] = result("general_rl", {"train/loss": 1.0})
    assert reused_evaluations(stages["distill_on"], upstream) == ["student"]
    assert reused_evaluations(stages["fusion"], upstream) == []  # not a kind that reports reference models


def test_posttrain_eval_prints_each_paired_change_with_the_test_it_used():
    """`posttrain eval A B --samples K`: greedy accuracy's change with McNemar's p, sampled pass@1's
    (shares of k samples) with a paired bootstrap, each marked significant or not."""
    from pipeline.cli.eval import main_table

    metrics = {"eval/accuracy": 0.5, "eval/accuracy_lo": 0.3, "eval/accuracy_hi": 0.7, "eval/accuracy_n": 20,
               "eval/pass_at_1": 0.4, "eval/pass_at_1_lo": 0.3, "eval/pass_at_1_hi": 0.5}
    results = [{"model": m, "metrics": metrics, "cached": False} for m in ("a", "b")]
    paired = [{"model": "b", "against": "a",
               "accuracy": {"delta": 0.1, "lo": -0.05, "hi": 0.25, "n": 20, "p": 0.3, "significant": False},
               "pass_at_1": {"delta": -0.07, "lo": -0.11, "hi": -0.02, "n": 20, "significant": True}}]
    text = main_table(results, paired)
    assert "b against a: accuracy +0.100 [-0.050, +0.250] on 20 prompts, McNemar p = 0.3  (not significant" in text
    assert "b against a: pass_at_1 -0.070 [-0.110, -0.020] on 20 prompts (paired bootstrap)  (significant)" in text
    assert "pass_at_1" in text.splitlines()[0]  # its own column in the table
    reward = {"eval/rewards/reward_model_full/mean": 2.5, "eval/rewards/reward_model_full/mean_lo": 2.0,
              "eval/rewards/reward_model_full/mean_hi": 3.0, "eval/rewards/reward_model_full/std": 1.0}
    results = [{"model": m, "metrics": {**metrics, **reward}, "cached": False} for m in ("a", "b")]
    paired[0]["rewards/reward_model_full/mean"] = {"delta": 0.4, "lo": 0.1, "hi": 0.7, "n": 20, "significant": True}
    text = main_table(results, paired)
    assert "rewards/reward_model_full/mean" in text.splitlines()[0] and "2.5 [2, 3]" in text
    assert ("b against a: rewards/reward_model_full/mean +0.400 [+0.100, +0.700] on 20 prompts (paired bootstrap)"
            "  (significant)") in text


def test_a_reward_model_named_as_a_model_is_resolved_before_any_scoring(tiny_model):
    """`--reward reward_model:model=rm_whole@latest`: any model form, resolved to its directory;
    a name that finds nothing fails before a model is evaluated; other rewards pass untouched."""
    from pipeline.cli.eval import with_model_resolved
    from stages.common import RewardSpec

    named, fingerprint = with_model_resolved(RewardSpec(name="reward_model", params={"model": "tiny-qwen3", "scope": "full"}))
    assert named.params == {"model": str(tiny_model), "scope": "full"}
    assert fingerprint  # in the cache key: a reward model retrained in place does not serve old scores
    from pipeline.cli.eval import cache_path
    spec, rows = EvalSpec(rewards=[named]), [{"id": "a"}]
    assert cache_path("m", spec, rows, [fingerprint]) != cache_path("m", spec, rows, ["retrained"])
    # a stage no recipe has: the suite's shared home holds other tests' runs, r1's rm_whole among them
    with pytest.raises(LookupError, match="no completed run has a stage 'rm_nowhere'"):
        with_model_resolved(RewardSpec(name="reward_model", params={"model": "rm_nowhere@latest"}))
    plain = RewardSpec(name="format_think")
    assert with_model_resolved(plain) == (plain, None)


def test_the_budget_curve_reads_the_budgets_not_the_paired_steps_between_them():
    from pipeline.tracking.figures import budget_points

    metrics = {"eval/budget/16/accuracy": 0.1, "eval/budget/0/accuracy": 0.2, "eval/budget/unlimited/accuracy": 0.3,
               "eval/budget_step/16_minus_0/accuracy": -0.1, "eval/budget_step/unlimited_minus_16/accuracy": 0.2}
    assert budget_points(metrics) == [("0", 0.2), ("16", 0.1), ("unlimited", 0.3)]
