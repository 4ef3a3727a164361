"""Rewards and verifiers: answer equivalence, the papers' formulas, language, threads, adversarial input."""

import json
import os
import threading

import pytest

from toolkit.core.text import last_boxed
from toolkit.rewards import combined, get_reward, reward_stats
from toolkit.rewards.length import cosine_scaled, kimi_lambda, kimi_length_reward, overlong_penalty
from toolkit.rewards.math import score_math

CASES = [
 ("82", "The answer is \\boxed{82}.", 1.0),
 ("82", "\\boxed{83}", 0.0),
 ("\\frac{1}{2}", "\\boxed{0.5}", 1.0),
 ("0.5", "\\boxed{\\frac{1}{2}}", 1.0),
 ("\\frac{1}{2}", "\\boxed{\\dfrac{1}{2}}", 1.0),
 ("\\frac{1}{2}", "\\boxed{\\tfrac12}", 1.0),
 ("\\frac{2}{4}", "\\boxed{\\frac{1}{2}}", 1.0),
 ("1/3", "\\boxed{\\frac{1}{3}}", 1.0),
 ("0.333", "\\boxed{\\frac{1}{3}}", 0.0),
 ("50\\%", "\\boxed{50\\%}", 1.0),
 ("50\\%", "\\boxed{50}", 1.0),
 ("10", "\\boxed{10\\text{ cm}}", 1.0),
 ("10", "\\boxed{10 \\text{ meters}}", 1.0),
 ("\\{1,2,3\\}", "\\boxed{\\{3,2,1\\}}", 1.0),
 ("\\{1,2\\}", "\\boxed{\\{1,2,3\\}}", 0.0),
 ("(1,2]", "\\boxed{(1,2]}", 1.0),
 ("(1,2]", "\\boxed{[1,2]}", 0.0),
 ("(1, 2)", "\\boxed{(1,2)}", 1.0),
 ("(1,2)", "\\boxed{(2,1)}", 0.0),
 ("\\sqrt{2}", "\\boxed{\\sqrt 2}", 1.0),
 ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", 1.0),
 ("\\pi", "\\boxed{\\pi}", 1.0),
 ("3.14", "\\boxed{\\pi}", 0.0),
 ("x^2+2x+1", "\\boxed{(x+1)^2}", 1.0),
 ("-5", "\\boxed{-5}", 1.0),
 ("-5", "\\boxed{5}", 0.0),
 ("1000", "\\boxed{1,000}", 1.0),
 ("1000", "\\boxed{1000.}", 1.0),
 ("7", "The answer is \\boxed{\\boxed{7}}", 1.0),
 ("7", "first \\boxed{3}, finally \\boxed{7}", 1.0),
 ("3", "first \\boxed{3}, finally \\boxed{7}", 0.0),
 ("\\frac{3}{4}", "\\boxed{\\frac{3}{4}}.", 1.0),
 ("12", "\\boxed{ 12 }", 1.0),
 ("12", "\\boxed{1 2}", 0.0),
 ("12", "The answer is 12.", 1.0),
 ("12", "the answer is: 12", 1.0),
 ("12", "I think it is twelve", 0.0),
 ("12", "no boxed answer here", 0.0),
 ("12", "", 0.0),
 ("x=3", "\\boxed{3}", 1.0),
 ("3", "\\boxed{x=3}", 1.0),
 ("2", "\\boxed{\\frac{4}{2}}", 1.0),
 ("\\infty", "\\boxed{\\infty}", 1.0),
 ("1.5", "\\boxed{\\frac{3}{2}}", 1.0),
 ("1.5", "\\boxed{1.50}", 1.0),
 ("\\$5", "\\boxed{5}", 1.0),
 ("90^\\circ", "\\boxed{90}", 1.0),
 ("\\text{(A)}", "\\boxed{A}", 1.0),
]


@pytest.mark.parametrize("gold,completion,expected", CASES)
def test_answer_equivalence(gold, completion, expected):
    assert score_math(gold, completion) == expected


@pytest.mark.parametrize("gold", ["", None, "\\frac{", "}{", "\\invalid{{"])
def test_missing_or_unparseable_gold_is_unjudged_never_correct(gold):
    assert score_math(gold, "\\boxed{1}") is None
    assert score_math(gold, f"\\boxed{{{gold}}}") is None  # even an identical broken answer


def test_gold_goes_first():
    # math-verify is not symmetric: an interval gold is not matched by a bare number, and vice versa
    assert score_math("(1,2]", "\\boxed{(1,2]}") == 1.0


def test_last_boxed_matches_nested_braces():
    assert last_boxed("so \\boxed{\\frac{1}{\\sqrt{2}}} done") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{unbalanced") is None


def test_accuracy_reward_takes_chat_messages_and_counts_unjudged():
    reward = get_reward("accuracy_math", pooled=False)
    out = reward(prompts=[[]] * 3, completions=[[{"role": "assistant", "content": "\\boxed{4}"}], "\\boxed{5}", "x"],
                 answer=["4", "4", None])
    assert out == [1.0, 0.0, None] and reward.counters["unjudged"] == 1


def test_format_think_r1_and_r1_zero_styles():
    r1, zero = get_reward("format_think"), get_reward("format_think", answer_tags=True)
    good = "<think>\nreason\n</think>\n\nThe answer is 4."
    tags = "<think> reason </think> <answer> 4 </answer>"
    bad = ["no think", "<think>a</think>", "<think>a</think><think>b</think> x", "</think> x <think>"]
    assert r1(completions=[good, *bad]) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert zero(completions=[tags, good, "<think>a</think> <answer></answer>"]) == [1.0, 0.0, 0.0]


# ---- Kimi k1.5 length reward (RECIPES.md): lambda = 0.5 - (len - min)/(max - min)

def test_kimi_lambda_worked_example():
    assert kimi_lambda([100, 200, 300]) == [0.5, 0.0, -0.5]
    assert kimi_lambda([50, 50]) == [0.0, 0.0]


def test_kimi_reward_correct_keeps_lambda_wrong_clips_at_zero():
    assert kimi_length_reward([100, 200, 300, 100], [1.0, 1.0, 0.0, 0.0]) == [0.5, 0.0, -0.5, 0.0]


def test_kimi_reward_groups_by_prompt_and_uses_token_lengths():
    reward = get_reward("length_kimi")
    prompts = ["p1", "p1", "p2", "p2"]
    out = reward(prompts=prompts, completions=["\\boxed{1}", "\\boxed{1}", "\\boxed{2}", "\\boxed{3}"],
                 answer=["1", "1", "2", "2"], completion_ids=[[0] * 10, [0] * 30, [0] * 5, [0] * 15])
    assert out == [0.5, -0.5, 0.5, -0.5]


# ---- DAPO soft overlong punishment: L_max 20480, L_cache 4096 (paper values)

@pytest.mark.parametrize("length,expected", [(16384, 0.0), (1000, 0.0), (18432, -0.5), (20480, -1.0),
                                             (20481, -1.0), (17408, -0.25)])
def test_dapo_overlong_worked_values(length, expected):
    assert overlong_penalty(length, 20480, 4096) == pytest.approx(expected)


def test_cosine_length_endpoints():
    assert cosine_scaled(0, True, 1000) == pytest.approx(1.0)
    assert cosine_scaled(1000, True, 1000) == pytest.approx(0.5)
    assert cosine_scaled(0, False, 1000) == pytest.approx(-1.0)
    assert cosine_scaled(1000, False, 1000) == pytest.approx(-0.5)


def test_repetition_penalty():
    reward = get_reward("repetition", ngram=2, max_penalty=-1.0)
    out = reward(completions=["a b c d e", "a b a b a b a b"])
    assert out[0] == 0.0 and out[1] == pytest.approx(-(1 - 2 / 7))


# ---- language consistency

def test_language_consistency_pure_mixed_and_code_heavy():
    reward = get_reward("language_consistency", language="en")
    pure = "<think>First add the numbers, then check the sum.</think> 42"
    mixed = "<think>我们先计算 then add them</think> 42"  # 5 Han characters, 3 English words... see below
    code = "<think>Use `np.sum(x)` and ```python\nprint(total_sum)\n``` then $\\frac{a}{b}$ done</think> 1"
    out = reward(completions=[pure, mixed, code])
    assert out[0] == 1.0
    assert out[1] == pytest.approx(3 / 8)  # 我们先计算 = 5 words in Han script, then/add/them = 3 in Latin
    assert out[2] == 1.0  # code and math are neutral: only "Use", "and", "then", "done" count
    zh = get_reward("language_consistency", language="zh")
    assert zh(completions=[mixed])[0] == pytest.approx(5 / 8)


def test_language_from_row_column_and_only_neutral_text():
    reward = get_reward("language_consistency")
    out = reward(completions=["<think>Привет мир hello</think> x", "<think>$x^2$ 42</think> x"], language=["ru", "en"])
    assert out == [pytest.approx(2 / 3), None]


# ---- combination and stats

def test_combined_and_stats():
    rewards = {"a": [1.0, None, 0.0], "b": [1.0, 1.0, None]}
    assert combined(rewards, {"a": 1.0, "b": 0.5}) == [1.5, 0.5, 0.0]
    stats = reward_stats("a", rewards["a"])
    assert stats == {"rewards/a/mean": 0.5, "rewards/a/std": 0.5, "rewards/a/none": 1.0}


def test_ifeval_constraints_fraction():
    reward = get_reward("ifeval_constraints")
    spec = json.dumps([{"type": "lowercase"}, {"type": "keywords", "words": ["tea"]}, {"type": "word_count", "max": 3}])
    assert reward(completions=["<think>x</think> i like tea", "I Like Coffee a lot"], answer=[spec, spec]) == [1.0, 0.0]


def test_every_reward_works_from_a_non_main_thread(tmp_path, tiny_model):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from toolkit.rewards import REWARDS

    # an untrained reward model (the tiny model with a fresh score head): its scores are real floats
    AutoModelForSequenceClassification.from_pretrained(str(tiny_model), num_labels=1).save_pretrained(tmp_path / "rm")
    AutoTokenizer.from_pretrained(str(tiny_model)).save_pretrained(tmp_path / "rm")
    needs = {"language_consistency": {"language": "en"}, "reward_model": {"model": str(tmp_path / "rm")}}
    columns = {"answer": ["4"], "language": ["en"]}
    results, errors = {}, []

    def call(name):
        try:
            params = needs.get(name, {})
            answer = [json.dumps({"tests": ["assert 2 + 2 == 4"]})] if name == "code_exec" else (
                [json.dumps([{"type": "lowercase"}])] if name == "ifeval_constraints" else columns["answer"])
            results[name] = get_reward(name, **params)(prompts=["p"], completions=["<think>add</think> \\boxed{4}"],
                                                       **{**columns, "answer": answer})
        except Exception as e:
            errors.append((name, e))

    threads = [threading.Thread(target=call, args=(n,)) for n in REWARDS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and set(results) == set(REWARDS)
    assert results["accuracy_math"] == [1.0]
    assert isinstance(results["reward_model"][0], float)


def _children() -> set[int]:
    me = str(os.getpid())
    out = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if open(f"/proc/{p}/stat").read().split()[3] == me:
                    out.add(int(p))
            except OSError:
                pass
    return out


def test_adversarial_answers_time_out_score_zero_and_leave_no_process():
    import time

    from toolkit.rewards.math import AccuracyMath

    reward = AccuracyMath(timeout_s=2.0, workers=2)
    adversarial = ["\\boxed{2^{2^{2^{100}}}}", "\\boxed{" + "9" * 1_000_000 + "}",
                   "\\boxed{" + "{" * 3000 + "1" + "}" * 3000 + "}", "\\boxed{\\frac{1}{", "\\boxed{" + "(" * 500 + "}",
                   "\\boxed{10^{10^{10^{10}}}!}"]
    start = time.time()
    out = reward(completions=adversarial, answer=["1"] * len(adversarial))
    assert out == [0.0] * len(adversarial)
    # at worst every sample times out, two at a time
    assert time.time() - start <= (2.0 + 1.0) * len(adversarial) / 2 + 2
    from toolkit.rewards.math import _POOLS

    pool = _POOLS[(2, 2.0)]
    assert pool.timeouts >= 1 and reward.counters["timeouts"] == pool.timeouts
    spawned = list(pool.spawned)
    assert len(spawned) > 2  # timed-out workers were replaced
    pool.close()
    del _POOLS[(2, 2.0)]
    time.sleep(0.2)
    alive = [pid for pid in spawned if os.path.exists(f"/proc/{pid}")
             and open(f"/proc/{pid}/stat").read().split()[2] != "Z"]
    assert alive == []


# ---- reward integrity (each case below scored wrong before)

@pytest.mark.parametrize("gold,completion", [("forty two", "\\boxed{two forty}"), ("none", "\\boxed{neon}"),
                                             ("yes", "\\boxed{yes}"), ("twelve", "\\boxed{12}"),
                                             ("\\text{no}", "\\boxed{on}")])
def test_prose_golds_are_unjudged(gold, completion):
    assert score_math(gold, completion) is None


def test_gold_goes_first_on_an_asymmetric_pair():
    from math_verify import parse, verify

    gold, pred = "1,2", "1 < x < 2"
    g, p = (parse(f"${x}$", parsing_timeout=None) for x in (gold, pred))
    assert verify(p, g, timeout_seconds=None) and not verify(g, p, timeout_seconds=None)  # the pair is asymmetric
    assert score_math(gold, f"\\boxed{{{pred}}}") == 0.0


def test_answer_tags_read_the_last_answer_block():
    tags = get_reward("accuracy_math", answer_tags=True, pooled=False)
    completions = ["<think>2 + 2</think> <answer> 4 </answer>", "<think>x</think> <answer>\\boxed{4}</answer>",
                   "<think>so \\boxed{4}</think> <answer>5</answer>", "<think>4</think> no tags: \\boxed{4}",
                   "<answer>4</answer> <think>unfinished"]
    assert tags(completions=completions, answer=["4"] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]
    plain = get_reward("accuracy_math", pooled=False)
    assert plain(completions=completions[:1], answer=["4"]) == [0.0]  # why r1_zero needed the option


def test_after_think_only_counts_the_answer_after_thinking():
    reward = get_reward("accuracy_math", after_think=True, pooled=False)
    completions = ["<think>maybe \\boxed{4}</think> The answer is \\boxed{4}.", "<think>so \\boxed{4}</think> I give up.",
                   "<think>still thinking... \\boxed{4}"]
    assert reward(completions=completions, answer=["4"] * 3) == [1.0, 0.0, 0.0]


def test_a_scoring_error_is_none_and_counted_never_zero():
    from toolkit.rewards.pool import ScoringPool

    pool = ScoringPool(int, workers=1, timeout_s=5)  # int("x") raises ValueError in the worker
    try:
        assert pool.map([("x",), ("7",), ("y",)]) == [None, 7, None] and pool.errors == 2
    finally:
        pool.close()


def test_a_pool_whose_workers_cannot_start_raises():
    from toolkit.rewards.pool import PoolBroken, ScoringPool

    pool = ScoringPool(os._exit, workers=1, timeout_s=5)  # every worker dies on its first sample
    try:
        with pytest.raises(PoolBroken):
            pool.map([(1,)] * 8)
    finally:
        pool.close()


def test_cjk_text_with_digits_stays_chinese():
    reward = get_reward("language_consistency", language="zh")
    assert reward(completions=["<think>我们有3个苹果和5个梨</think> 8"]) == [1.0]
    assert get_reward("language_consistency", language="en")(completions=["<think>use x2 and var_1 here</think> 1"]) == [1.0]


def test_repetition_counts_tokens_when_given_and_has_no_negative_zero():
    reward = get_reward("repetition", ngram=3)
    text = "一二三一二三一二三"  # no spaces: one "word"
    assert reward(completions=[text]) == [0.0]
    out = reward(completions=[text], completion_ids=[[1, 2, 3, 1, 2, 3, 1, 2, 3]])
    assert out == [pytest.approx(-(1 - 3 / 7))]
    clean = reward(completions=["a b c d e"])[0]
    assert clean == 0.0 and str(clean) == "0.0"


def test_overlong_defaults_to_the_stage_length_and_allows_a_hard_cutoff():
    from toolkit.rewards import check_reward

    assert get_reward("overlong_dapo", stage_max_length=256).max_len == 256
    assert get_reward("overlong_dapo", stage_max_length=256).cache_len == 51
    hard = get_reward("overlong_dapo", max_len=100, cache_len=0)
    assert hard(completions=["x"], completion_ids=[[0] * 100, [0] * 101][:1]) == [0.0]
    assert hard(completions=["x"], completion_ids=[[0] * 101]) == [-1.0]
    assert "no rollout can reach it" in check_reward("overlong_dapo", {"max_len": 20480}, stage_max_length=256)
    assert "never applies" in check_reward("overlong_dapo", {"max_len": 256, "cache_len": 0}, stage_max_length=256)
    assert check_reward("overlong_dapo", {"max_len": 200, "cache_len": 0}, stage_max_length=256) is None


def test_evaluation_measures_length_rewards_in_tokens():
    from stages.common import RewardSpec
    from stages.evaluate import score_rewards

    rows = [{"prompt": [{"role": "user", "content": "q"}], "answer": "1", "language": "en"}] * 2
    spec = [RewardSpec(name="overlong_dapo", params={"cache_len": 4})]
    by_tokens, _ = score_rewards(spec, rows, ["short", "short"], completion_ids=[[0] * 4, [0] * 8], max_length=8)
    assert by_tokens["eval/rewards/overlong_dapo/mean"] == pytest.approx(-0.5)  # 0 and -1


def test_two_rewards_of_one_name_are_scored_and_logged_apart():
    """Two reward models of one scope (or any reward twice, with other params) keep a line each,
    in an evaluation and in training's logs and counters: named as training names them, the second
    `_2`; before, the second overwrote the first, and the combined mean counted one of them."""
    from stages.common import RewardSpec
    from stages.evaluate import score_rewards
    from stages.grpo import stage_reward
    from toolkit.rewards import distinct_names, reward_counter_metrics

    rows = [{"prompt": [{"role": "user", "content": "q"}], "answer": "1", "language": "en"}] * 2
    spec = [RewardSpec(name="overlong_dapo", params={"cache_len": 4}),
            RewardSpec(name="overlong_dapo", params={"cache_len": 2}, weight=2.0)]
    metrics, per_prompt = score_rewards(spec, rows, ["a", "b"], completion_ids=[[0] * 6, [0] * 8], max_length=8)
    assert per_prompt == {"reward/overlong_dapo": [-0.5, -1.0], "reward/overlong_dapo_2": [0.0, -1.0]}
    assert metrics["eval/rewards/overlong_dapo/mean"] == pytest.approx(-0.75)
    assert metrics["eval/rewards/overlong_dapo_2/mean"] == pytest.approx(-0.5)
    assert metrics["eval/rewards/overlong_dapo/mean_n"] == 2 and "eval/rewards/overlong_dapo_2/mean_lo" in metrics
    assert metrics["eval/rewards/combined/mean"] == pytest.approx((-0.5 + 2 * 0.0 - 1.0 + 2 * -1.0) / 2)
    trained = distinct_names([stage_reward(s, 8) for s in spec])
    assert [r.__name__ for r in trained] == ["overlong_dapo", "overlong_dapo_2"]  # TRL's `rewards/<name>/mean`
    trained[1].counters["probe"] = 3
    assert reward_counter_metrics(trained)["rewards/overlong_dapo_2/probe"] == 3.0


def test_evaluation_reads_lengths_from_the_ids_the_engine_generated(tiny_model):
    # the length rewards and the reported completion length alike: the tiny model's text encoded
    # again came back empty, so both read 0 where the engine had generated up to the limit
    from stages.common import RewardSpec
    from stages.evaluate import EvalSpec, evaluate
    from toolkit.rollouts.sampling import SamplingSpec

    rows = [{"id": str(i), "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "answer": str(2 * i),
             "language": "en", "verifier": "math"} for i in range(6)]
    limit = 12  # a penalty of -n / limit for n tokens: the mean reads the lengths the reward saw
    spec = EvalSpec(max_new_tokens=limit, table_rows=0,
                    rewards=[RewardSpec(name="overlong_dapo", params={"max_len": limit, "cache_len": limit})])
    done = spec.generation.open(str(tiny_model)).complete([r["prompt"] for r in rows], SamplingSpec(max_new_tokens=limit))
    generated = [cs[0].tokens for cs in done]
    result = evaluate(str(tiny_model), spec, rows)
    assert result.metrics["eval/rewards/overlong_dapo/mean"] == pytest.approx(-sum(generated) / len(generated) / limit)
    assert result.scores["tokens"] == generated and sum(generated) > 0
    assert result.metrics["eval/completion_tokens_mean"] == pytest.approx(sum(generated) / len(generated))


def test_format_tags_gives_partial_credit():
    two, four = get_reward("format_tags"), get_reward("format_tags", answer_tags=True)
    samples = ["<think>a</think> b", "<think>a b", "<think>a</think><think> b", "nothing",
               "<think>a</think> <answer>b</answer>"]
    assert two(completions=samples) == [1.0, 0.5, 0.5, 0.0, 1.0]  # a doubled <think> earns nothing
    assert four(completions=samples) == [0.5, 0.25, 0.25, 0.0, 1.0]


def test_every_shipped_recipe_can_earn_its_rewards():
    from pipeline.recipe import list_recipes, load_recipe

    for name in list_recipes():
        load_recipe(name, "tiny")  # raises RecipeError when a reward cannot be earned


def test_a_reward_the_template_cannot_earn_is_refused_with_its_path():
    from pipeline.recipe import RecipeError, load_recipe

    with pytest.raises(RecipeError) as e:
        load_recipe("r1_zero", "tiny", ["stages.zero_rl.rewards=[{name: accuracy_math}]"])
    assert "stages[0].rewards[0].params" in str(e.value) and "cannot be earned with template 'r1_zero'" in str(e.value)
    with pytest.raises(RecipeError, match=r"eval\.rewards\[0\]"):
        load_recipe("r1_zero", "tiny", ["eval.rewards=[{name: accuracy_math}]"])
