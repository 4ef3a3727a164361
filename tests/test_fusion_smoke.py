"""`fusion_smoke` on `tiny` through the real flow: rejection sampling keeps only verified samples,
the fusion model follows /think and /no_think (the last flag winning), and thinking budgets cut the
thinking exactly as specified."""

import json
from pathlib import Path

import mlflow
import pytest

from data_curation.sources import load_rows
from tests.conftest import run_cli, run_named_recipe
from toolkit.core.thinking import EMPTY_THINK, STOP_THINKING, complies, flag_messages, response_only
from toolkit.rewards.verifiers import score_rows
from toolkit.rollouts import SamplingSpec, open_engine
from toolkit.rollouts.sampling import complete

pytestmark = pytest.mark.slow
STOP_SENTENCE = "Considering the limited time by the user"


@pytest.fixture(scope="module")
def fusion_run(prefect_harness, tiny_model):
    return {s["name"]: s for s in run_named_recipe("fusion_smoke")["stages"]}


@pytest.fixture(scope="module", params=["hf", "ct2", "ort", "ov"])
def fusion_model(fusion_run, request):
    """The fusion model in each generation engine: modes and budgets must work the same on all."""
    return open_engine(str(Path(fusion_run["fusion"]["output_dir"]) / "model"), request.param)


@pytest.fixture(scope="module")
def held_out():
    return load_rows("synthetic_math", "eval", 40, 0, {})


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _greedy(engine, prompts, **spec) -> list:
    return [c[0] for c in engine.complete(prompts, SamplingSpec(**{"max_new_tokens": 96, **spec}))]


def test_rejection_sampling_keeps_only_verified_samples(fusion_run):
    out = Path(fusion_run["rs"]["output_dir"])
    report = json.loads((out / "report.json").read_text())
    kept, removed = _jsonl(out / "kept.jsonl"), _jsonl(out / "removed.jsonl")
    assert kept, "the tiny recipe must keep some samples"
    assert report["rows_in"] == report["prompts"] * report["samples_per_prompt"] == len(kept) + len(removed)
    assert sum(report["removed"].values()) == len(removed)
    assert set(report["removed"]) <= {"truncated", "unjudgeable", "wrong", "no_thinking", "not_selected"} | {
        f"filtered:{r}" for r in ("mixed_language", "long_paragraph", "code_in_math", "repetition", "answer_disagrees")}
    assert score_rows(kept, [r["solution"] for r in kept], after_think=True) == [1.0] * len(kept)
    per_prompt = {}
    for r in kept:
        per_prompt[r["id"].rsplit("#rs", 1)[0]] = per_prompt.get(r["id"].rsplit("#rs", 1)[0], 0) + 1
    assert max(per_prompt.values()) <= 2  # max_per_prompt
    assert report["by_difficulty"]["1"]["kept"] == len(kept)
    client = mlflow.MlflowClient()
    names = {a.path for a in client.list_artifacts(fusion_run["rs"]["mlflow_run_id"])}
    assert {"thinking_lengths.png", "examples.json", "report.json"} <= names


def test_fusion_set_composition_is_logged(fusion_run):
    out = Path(fusion_run["fusion_data"]["output_dir"])
    report = json.loads((out / "report.json").read_text())
    rows = _jsonl(out / "kept.jsonl")
    assert report["rows"] == len(rows) and report["think"] + report["no_think"] == len(rows)
    assert 0.2 < report["share_multi_turn"] < 0.4 and report["think_unflagged"] > 0  # the tiny profile's 0.3
    metrics = mlflow.MlflowClient().get_run(fusion_run["fusion_data"]["mlflow_run_id"]).data.metrics
    assert metrics["fusion/share_no_think"] == pytest.approx(report["share_no_think"])


def test_fusion_stage_reports_modes_and_budgets(fusion_run):
    metrics = fusion_run["fusion"]["metrics"]
    for mode in ("think", "no_think"):
        for name in ("accuracy", "mode_compliance", "language_consistency", "answer_tokens_mean"):
            assert f"eval/mode/{mode}/{name}" in metrics
    gain = metrics["eval/mode/think/accuracy"] - metrics["eval/mode/no_think/accuracy"]
    assert metrics["eval/mode/think_minus_no_think/accuracy"] == pytest.approx(gain)  # on the same prompts
    assert metrics["eval/mode/think_minus_no_think/accuracy_lo"] <= gain <= metrics["eval/mode/think_minus_no_think/accuracy_hi"]
    for budget in ("0", "8", "24", "unlimited"):
        assert f"eval/budget/{budget}/accuracy" in metrics
    assert metrics["eval/budget/8/thinking_tokens_mean"] <= 8
    assert metrics["eval/budget/0/thinking_tokens_mean"] == 0
    names = {a.path for a in mlflow.MlflowClient().list_artifacts(fusion_run["fusion"]["mlflow_run_id"])}
    assert "budget_curve.png" in names


def test_fusion_model_follows_the_flags(fusion_model, held_out):
    """The issue's evidence: on held-out prompts, greedy, at least 90% per mode."""
    for mode in ("think", "no_think"):
        done = _greedy(fusion_model, [flag_messages(r["prompt"], mode) for r in held_out])
        rate = sum(complies(c.text, mode, cut=not c.finished) for c in done) / len(done)
        assert rate >= 0.9, (mode, rate, [c.text for c in done[:3]])


def test_the_last_flag_wins_in_multi_turn_prompts(fusion_model, held_out):
    earlier = held_out[::-1]
    for first, last in (("think", "no_think"), ("no_think", "think")):
        prompts = [[*flag_messages(e["prompt"], first), {"role": "assistant", "content": response_only(e["solution"])},
                    *flag_messages(r["prompt"], last)] for e, r in zip(earlier, held_out)]
        done = _greedy(fusion_model, prompts)
        rate = sum(complies(c.text, last, cut=not c.finished) for c in done) / len(done)
        assert rate >= 0.9, (first, last, rate, [c.text for c in done[:3]])


def test_budget_inserts_the_stop_string_once_and_only_when_hit(fusion_model, held_out):
    prompts = [flag_messages(r["prompt"], "think") for r in held_out]
    free = _greedy(fusion_model, prompts)
    assert all(STOP_SENTENCE not in c.text for c in free)
    cut = _greedy(fusion_model, prompts, thinking_budget=4, answer_max_new_tokens=32)
    for c in cut:
        assert c.thinking_tokens <= 4
        assert c.budget_hit == (STOP_SENTENCE in c.text)
        assert c.text.count(STOP_SENTENCE) <= 1
        # the inserted string closes the thinking the budget cut (none closed before it); what the
        # model writes after it is its answer, a stray `</think>` of its own included
        before, _, after = c.text.partition(STOP_SENTENCE)
        assert "</think>" not in before if c.budget_hit else c.text.count("</think>") >= 1
        assert not c.budget_hit or after.startswith(STOP_THINKING.split(STOP_SENTENCE, 1)[1].rstrip())
    hit = [c for c in cut if c.budget_hit]
    assert len(hit) >= 0.9 * len(cut)  # the model thinks for far more than 4 tokens
    stop_body = STOP_THINKING.strip()
    answered = [c for c in hit if c.text.split(stop_body, 1)[1].strip()]
    assert len(answered) >= 0.9 * len(hit), [c.text for c in hit[:3]]  # the answer follows the inserted string
    budget = 90
    roomy = _greedy(fusion_model, prompts, thinking_budget=budget, answer_max_new_tokens=96)
    # greedy, so a budget run thinks as the free run did. A thought the free run closed (within its 96
    # tokens, far from 90 at this size) is never cut, nor one it ended with the end token before the
    # budget, unclosed (the tiny model did on an AMD machine). One still open at 90 tokens (a tiny model
    # looping, as one did on an AMX machine) is cut there like any other.
    def reaches_budget(free_run) -> bool:
        ended_early = free_run.finished and free_run.tokens <= budget
        return "</think>" not in free_run.text and not ended_early

    reached = [reaches_budget(f) for f in free]
    for f, r, cut in zip(free, roomy, reached):
        assert r.budget_hit == cut and (STOP_SENTENCE in r.text) == cut, (f.text, r.text)
    untouched = [(f.text, r.text) for f, r, cut in zip(free, roomy, reached) if not cut]
    same = sum(a == b for a, b in untouched)
    assert untouched and same >= 0.9 * len(untouched)  # a budget never reached changes nothing


def test_a_budget_answers_in_a_batch_as_alone_when_pad_is_the_end_token(fusion_run, fusion_model, held_out):
    """SmolLM2's pad token is its end token. A row that closes its thinking before the others is
    padded with it while they go on; that padding is not an end of turn, so the row still answers,
    exactly as it does alone."""
    import copy

    from toolkit.rollouts.ct2 import ct2_sampler, load_ct2
    from toolkit.rollouts.hf import hf_sampler, load_for_generation
    from toolkit.rollouts.ort import converted, open_model, ort_sampler
    from toolkit.rollouts.ov import converted as ov_converted
    from toolkit.rollouts.ov import open_pipeline, ov_sampler

    model_dir = str(Path(fusion_run["fusion"]["output_dir"]) / "model")
    same_pad = copy.deepcopy(fusion_model.tokenizer)
    same_pad.pad_token = same_pad.eos_token
    assert same_pad.pad_token_id == same_pad.eos_token_id
    sample = {"hf": lambda: hf_sampler(load_for_generation(model_dir)[0], same_pad),
              "ct2": lambda: ct2_sampler(load_ct2(model_dir, "float32", 1), same_pad),
              "ort": lambda: ort_sampler(open_model(converted(model_dir, "float32"), 1), same_pad),
              "ov": lambda: ov_sampler(open_pipeline(ov_converted(model_dir), "float32", 1), same_pad)}[fusion_model.name]()
    prompts = [flag_messages(r["prompt"], "think") for r in held_out[:12]]
    spec = {"max_new_tokens": 96, "thinking_budget": 90, "answer_max_new_tokens": 32}
    batched = [c[0] for c in complete(sample, same_pad, prompts, SamplingSpec(batch_size=12, **spec))]
    alone = [complete(sample, same_pad, [p], SamplingSpec(batch_size=1, **spec))[0][0] for p in prompts]
    closed = [c for c in batched if not c.budget_hit]
    assert closed and len({c.thinking_tokens for c in closed}) > 1  # rows closed their thinking at different steps
    assert all(c.text.split("</think>", 1)[1].strip() for c in closed), [c.text for c in closed[:3]]
    same = sum(b.text == a.text for b, a in zip(batched, alone))
    assert same >= 0.9 * len(prompts), [(b.text, a.text) for b, a in zip(batched, alone) if b.text != a.text][:2]


def test_ort_budgets_in_one_pass_give_the_two_phase_completions(fusion_run, held_out):
    """ORT forces the stop-thinking string into a row's own generation instead of feeding every
    unfinished row through the model again: greedy, each completion is the two-phase path's, text,
    token counts and budget flag alike, over rows that hit the budget, close their thinking first,
    or end."""
    import functools

    from toolkit.rollouts.hf import load_tokenizer
    from toolkit.rollouts.ort import converted, open_model, ort_sampler

    model_dir = str(Path(fusion_run["fusion"]["output_dir"]) / "model")
    tokenizer, model = load_tokenizer(model_dir), open_model(converted(model_dir, "float32"), 1)
    prompts = [flag_messages(r["prompt"], "think") for r in held_out]
    seen = set()
    for budget in (4, 24, 60):
        spec = SamplingSpec(max_new_tokens=96, thinking_budget=budget, answer_max_new_tokens=12, batch_size=40)
        one_pass = ort_sampler(model, tokenizer)
        two_phase = functools.partial(ort_sampler(model, tokenizer))  # the sampler without its `budgeted`
        assert hasattr(one_pass, "budgeted") and not hasattr(two_phase, "budgeted")
        one, two = ([c[0] for c in complete(s, tokenizer, prompts, spec)] for s in (one_pass, two_phase))
        fields = [[(c.text, c.tokens, c.thinking_tokens, c.budget_hit, c.finished) for c in cs] for cs in (one, two)]
        assert fields[0] == fields[1], [(a, b) for a, b in zip(*fields) if a != b][:2]
        seen |= {"hit" if c.budget_hit else "closed" if "</think>" in c.text else "ended" for c in one}
    assert {"hit", "closed"} <= seen, seen


def test_budgets_derived_from_the_greedy_pass_are_the_generated_ones(fusion_model, held_out, monkeypatch):
    """The evaluation derives each thinking budget from its greedy pass and generates only the rows
    whose budget ran out: on every engine, each derived completion is the generated one, field for
    field, over rows that hit the budget, close their thinking first (their answers cut at the answer
    limit or not), or end; and from a pass cut at
    16 tokens, rows whose pass ran out before the budget or before the answer limit."""
    prompts = [flag_messages(r["prompt"], "think") for r in held_out]
    passes = {96: _greedy(fusion_model, prompts), 16: _greedy(fusion_model, prompts, max_new_tokens=16)}
    sampled: list[int] = []
    real = fusion_model._greedy_sampler

    def counting():
        sample = real()
        return lambda seqs, *args: (sampled.append(len(seqs)), sample(seqs, *args))[1]
    monkeypatch.setattr(fusion_model, "_greedy_sampler", counting)
    seen, counts = set(), {}
    for limit, budget, answer in ((96, 4, 12), (96, 24, 12), (96, 60, 4), (16, 24, 12)):
        spec = SamplingSpec(max_new_tokens=96, thinking_budget=budget, answer_max_new_tokens=answer, batch_size=40)
        sampled.clear()
        derived = [c[0] for c in fusion_model.complete_budgeted(prompts, spec, passes[limit])]
        rows_generated = sum(sampled)
        generated = [c[0] for c in fusion_model.complete(prompts, spec)]
        fields = [[(c.text, c.tokens, c.thinking_tokens, c.budget_hit, c.finished) for c in cs] for cs in (derived, generated)]
        assert fields[0] == fields[1], (limit, budget, [(a, b) for a, b in zip(*fields) if a != b][:2])
        counts[limit, budget] = (sum(c.budget_hit for c in derived), rows_generated)
        seen |= {"hit" if c.budget_hit else "closed" if "</think>" in c.text else "ended" for c in derived}
    assert {"hit", "closed"} <= seen, seen
    assert all(hits <= generated for hits, generated in counts.values()), counts  # every cut row is continued
    assert counts[96, 60][1] < len(prompts), counts  # and rows that closed in time are not generated again
    assert counts[16, 24][1] > counts[96, 24][1], counts  # rows the short pass cannot tell are generated


def test_budget_zero_is_the_no_think_mode(fusion_model, held_out):
    prompts = [r["prompt"] for r in held_out[:16]]
    zero = [c.text for c in _greedy(fusion_model, prompts, thinking_budget=0)]
    no_think = [c.text for c in _greedy(fusion_model, prompts, enable_thinking=False)]
    assert zero == no_think
    rendered = fusion_model.tokenizer.apply_chat_template(prompts[0], tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False)
    assert rendered.endswith(EMPTY_THINK)
    # the evaluation counts budget 0's answers that close a think block anyway (the model thought)
    from stages.eval_modes import budget_metrics
    from stages.evaluate import EvalSpec

    spec = EvalSpec(max_new_tokens=24, budgets=[0])
    closed = [c[0].text for c in fusion_model.complete(prompts, SamplingSpec(
        max_new_tokens=24, thinking_budget=0, answer_max_new_tokens=spec.answer_max_new_tokens, batch_size=spec.batch_size))]
    share = budget_metrics(fusion_model, held_out[:16], spec, [0])["eval/budget/0/thought_anyway_share"]
    assert share == sum("</think>" in t for t in closed) / 16


def test_generate_cli_reports_the_budget_as_json(fusion_run):
    model = str(Path(fusion_run["fusion"]["output_dir"]) / "model")
    done = run_cli("generate", "--model", model, "--prompt", "What is 12 + 7? /think", "--thinking-budget", "4",
                   "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(out) >= {"thinking", "answer", "thinking_tokens", "truncated", "text"}
    assert out["truncated"] and out["thinking_tokens"] <= 4 and out["text"].count(STOP_SENTENCE) == 1
    assert STOP_SENTENCE not in out["thinking"] and out["answer"]
    plain = json.loads(run_cli("generate", "--model", model, "--prompt", "What is 12 + 7?", "--no-think",
                               "--json").stdout.strip().splitlines()[-1])
    assert plain["thinking"] == "" and plain["thinking_tokens"] == 0 and not plain["truncated"]


def test_the_unlimited_budget_is_the_greedy_pass_not_a_second_one(fusion_run, held_out, monkeypatch):
    """Budget null on the chat prompts as they are generates exactly what the greedy pass did, so the
    evaluation reuses that pass (one of the seven a qwen3 demo evaluation ran) instead of repeating it."""
    from stages.evaluate import EvalSpec, evaluate
    from toolkit.rollouts import Engine

    budgets_run: list = []
    real = Engine.complete
    monkeypatch.setattr(Engine, "complete", lambda self, prompts, spec, progress=False: (
        budgets_run.append(spec.thinking_budget), real(self, prompts, spec, progress))[1])
    model = str(Path(fusion_run["fusion"]["output_dir"]) / "model")
    metrics = evaluate(model, EvalSpec(max_new_tokens=32, budgets=[8, None]), held_out[:16]).metrics
    assert budgets_run == [None]  # the greedy pass; budget 8 derived from it, unlimited is it
    assert "eval/budget/8/accuracy" in metrics
    step = metrics["eval/budget_step/unlimited_minus_8/accuracy"]  # each step up the budgets, paired
    assert step == pytest.approx(metrics["eval/budget/unlimited/accuracy"] - metrics["eval/budget/8/accuracy"])
    low, high = (metrics[f"eval/budget_step/unlimited_minus_8/accuracy_{end}"] for end in ("lo", "hi"))
    assert low <= step <= high
    assert metrics["eval/budget/unlimited/accuracy"] == metrics["eval/accuracy"]
    assert metrics["eval/budget/unlimited/truncated_share"] == 0


def test_every_evaluation_metric_is_a_name_mlflow_takes(fusion_run, held_out, tmp_path):
    """All passes at once (greedy, k samples, modes, budgets) on a fused model, logged to a real
    MLflow store as a stage's metrics are: a name MLflow refuses (`eval/pass@1` was one) fails
    the run at its end, after all the compute."""
    import mlflow

    from stages.evaluate import EvalSpec, evaluate

    model = str(Path(fusion_run["fusion"]["output_dir"]) / "model")
    spec = EvalSpec(max_new_tokens=16, samples=2, modes=["think", "no_think"], budgets=[0, 8, None])
    done = evaluate(model, spec, held_out[:4])
    assert {"eval/pass_at_1", "eval/pass_at_2", "eval/maj_at_2", "eval/mode/no_think/accuracy"} <= set(done.metrics)
    assert len(done.scores["pass_at_1"]) == 4
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("names"))
    client.log_batch(run.info.run_id, metrics=[mlflow.entities.Metric(k, float(v), 0, 0) for k, v in done.metrics.items()])
    assert set(client.get_run(run.info.run_id).data.metrics) == set(done.metrics)
