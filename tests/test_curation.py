"""Curation steps on real sources: decontamination finds CHAMP items planted in synthetic training
data (verbatim and lightly edited) and keeps clean rows, and agrees exactly with a plain
implementation; dedup, trace and sampling filters drop what they should with their reasons."""

import json
import random
import sys

import pytest

from data_curation.decontaminate import build_index, decontaminate
from data_curation.ngrams import UNICODE_SPACE, chunk_ngram_hashes, word_ngrams
from data_curation.report import EverythingRemoved
from data_curation.sources import load_rows
from pipeline.recipe import RecipeError, load_recipe
from stages.curation import CURATION_CONFIGS, curate


def row(i, text, **extra):
    return {"id": f"t/{i}", "prompt": [{"role": "user", "content": text}], "answer": "1", "verifier": "math",
            "solution": None, "source": "t", "difficulty": 1, "language": "en", **extra}


@pytest.fixture(scope="module")
def planted():
    champ = load_rows("champ", "all")
    clean = load_rows("synthetic_math", "train", 300, seed=3)
    rows = [row(i, r["prompt"][-1]["content"]) for i, r in enumerate(clean)]
    verbatim, edited = champ[10], champ[42]
    words = edited["prompt"][-1]["content"].split()
    words[len(words) // 2] = "banana"  # one word changed in the middle: long runs survive on both sides
    rows[17] = row(17, "Here is a problem. " + verbatim["prompt"][-1]["content"] + " Show your work.")
    rows[123] = row(123, " ".join(words).upper())  # case and spacing do not hide it either
    return rows, champ, {"t/17": verbatim["id"], "t/123": edited["id"]}


def test_planted_champ_items_are_found_and_clean_rows_kept(planted):
    rows, champ, expected = planted
    index = build_index(champ, 8)
    flagged = {r["id"]: ev for r, ev in decontaminate(rows, index, "any") if ev}
    assert {k: v["eval_id"] for k, v in flagged.items()} == expected
    for rid, ev in flagged.items():  # the evidence n-gram really is in both texts
        text = next(r for r in rows if r["id"] == rid)["prompt"][-1]["content"].lower()
        assert len(ev["ngram"].split()) == 8 and ev["ngram"] in " ".join(text.split())


def test_coverage_mode_needs_most_of_an_item(planted):
    rows, champ, _ = planted
    item = champ[5]["prompt"][-1]["content"].split()
    fragment = row(999, "Consider: " + " ".join(item[:9]) + " and then something else entirely.")
    index = build_index(champ, 8)
    assert next(decontaminate([fragment], index, "any"))[1]["eval_id"] == champ[5]["id"]
    assert next(decontaminate([fragment], index, "coverage", 0.5))[1] is None
    (_, ev), = [(r, e) for r, e in decontaminate(rows, index, "coverage", 0.5) if e and r["id"] == "t/17"]
    assert ev["coverage"] == 1.0


def test_bulk_hashing_agrees_with_plain_tuples_on_awkward_text():
    r = random.Random(0)
    vocab = ["alpha", "Beta", "GAMMA", "δέλτα", "x", "y", "z", "42", "naïve", "日本", "end."]
    spaces = [" ", "  ", "\t", "\n", "\u00a0", "\u3000", "\x1c", " \u2009 "]
    texts = ["".join(r.choice(vocab) + r.choice(spaces) for _ in range(r.randint(0, 30))) for _ in range(400)]
    evals = [row(f"e{i}", t) for i, t in enumerate(texts[:60])]
    train = [row(i, t) for i, t in enumerate(texts[60:] + texts[:20])]
    for n in (2, 3, 5):
        exact = {g for e in evals for g in word_ngrams(e["prompt"][0]["content"], n)}
        want = [t["id"] for t in train if set(word_ngrams(t["prompt"][0]["content"], n)) & exact]
        index = build_index(evals, n)
        assert [t["id"] for t, ev in decontaminate(train, index, "any", chunk=37) if ev] == want
        hashes, rows = chunk_ngram_hashes([e["prompt"][0]["content"] for e in evals], n)
        assert len(hashes) == sum(len(word_ngrams(e["prompt"][0]["content"], n)) for e in evals)


def test_unicode_space_list_is_complete():
    every = {chr(c) for c in range(128, sys.maxunicode + 1) if chr(c).isspace()}
    assert {c for c in every if UNICODE_SPACE.fullmatch(c)} == every


def _cfg(kind, **fields):
    return CURATION_CONFIGS[kind].model_validate({"name": "x", "data": "synthetic_math", **fields})


def test_dedup_exact_and_near(tmp_path):
    base = ("A farmer has seventeen sheep and all but nine run away through a gap in the old fence "
            "near the river, so how many sheep does the farmer still have in the field at the end of the day")
    rows = [row(0, base), row(1, base.upper().replace(" ", "   ")), row(2, base.replace("seventeen", "eighteen")),
            row(3, "What is the capital of France?")]
    report = curate(_cfg("dedup"), rows, tmp_path)
    removed = {json.loads(line)["id"]: json.loads(line) for line in open(tmp_path / "removed.jsonl")}
    assert report["removed"] == {"exact_duplicate": 1, "near_duplicate": 1}
    assert removed["t/1"]["evidence"]["duplicate_of"] == "t/0" and removed["t/2"]["removed_reason"] == "near_duplicate"
    assert [json.loads(line)["id"] for line in open(tmp_path / "kept.jsonl")] == ["t/0", "t/3"]


def test_trace_filter_reasons(tmp_path):
    good = "<think>\n2 + 3 = 5.\n</think>\n\nThe answer is \\boxed{5}."
    rows = [row(0, "q", solution=good),
            row(1, "q", solution="<think>\n我们先计算 two plus three 等于 五 然后 再 检查 一下\n</think>\n\n\\boxed{5}"),
            row(2, "q", solution="<think>\n" + "word " * 400 + "\n</think>\n\n\\boxed{5}"),
            row(3, "q", solution="<think>\n```python\nprint(2 + 3)\n```\n</think>\n\n\\boxed{5}"),
            row(4, "q", solution="<think>\n" + "so we add again " * 30 + "\n</think>\n\n\\boxed{5}"),
            row(5, "q", solution="<think>\n2 + 3 = 5.\n</think>\n\nThe answer is \\boxed{6}."),
            row(6, "q", solution="The answer is 5.")]
    report = curate(_cfg("trace_filter"), rows, tmp_path)
    assert report["removed"] == {"mixed_language": 1, "long_paragraph": 1, "code_in_math": 1, "repetition": 1,
                                 "answer_disagrees": 1, "no_thinking": 1}
    assert [json.loads(line)["id"] for line in open(tmp_path / "kept.jsonl")] == ["t/0"]


def test_a_filter_that_removes_everything_fails_with_its_counts(tmp_path, tiny_model):
    rows = load_rows("synthetic_math", "train", 6, seed=0, params={"difficulties": [5]})
    cfg = _cfg("difficulty_filter", model=str(tiny_model), samples=2, max_new_tokens=8)
    with pytest.raises(EverythingRemoved, match=r"difficulty_filter removed every row \(6 in, 0 out; by reason: "
                                                r"\{'too_hard': 6\}\)"):
        curate(cfg, rows, tmp_path, str(tiny_model))
    assert not (tmp_path / "kept.jsonl").exists() and json.loads((tmp_path / "report.json").read_text())["rows_out"] == 0


def test_no_cot_filter_asks_for_a_bare_answer(tmp_path, tiny_model):
    from data_curation.sampling_filters import NO_COT_INSTRUCTION, no_cot_prompt

    rows = load_rows("synthetic_math", "train", 4, seed=0) + load_rows("general_chat", "all", 2)
    assert no_cot_prompt(rows[0], NO_COT_INSTRUCTION)[-1]["content"].endswith(NO_COT_INSTRUCTION)
    report = curate(_cfg("no_cot_filter", model=str(tiny_model), tries=2, max_new_tokens=6), rows, tmp_path,
                    str(tiny_model))
    assert report["rows_in"] == 6 and report["unverifiable_passed_through"] == 2
    assert report["rows_out"] + sum(report["removed"].values()) == 6


@pytest.mark.parametrize("override,message", [
    ("stages.decontam.eval_sets=[{path: /no/such.jsonl}]",
     "stages[1].eval_sets[0].path: data file /no/such.jsonl does not exist"),
    ("stages.difficulty.generation.engine=vllm", "stages[2].generation: vLLM rollouts need"),
    ("stages.difficulty.low=0.6|stages.difficulty.high=0.5", "low (0.6) must be below high (0.5)"),
])
def test_curation_configs_are_checked_before_anything_runs(override, message):
    with pytest.raises(RecipeError) as e:
        load_recipe("curated_rl", "tiny", override.split("|"))
    assert message in str(e.value)


def test_cli_decontaminate_writes_kept_removed_and_report(planted, tmp_path):
    from tests.conftest import run_cli

    rows, _, expected = planted
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"id": r["id"], "question": r["prompt"][0]["content"], "answer": "1"}) + "\n"
                             for r in rows))
    out = tmp_path / "out"
    proc = run_cli("curate", "decontaminate", "--train", str(train), "--eval", "champ", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["removed"] == {"contaminated": 2} and report["rows_out"] == len(rows) - 2
    removed = [json.loads(line) for line in open(out / "removed.jsonl")]
    assert {r["id"]: r["evidence"]["eval_id"] for r in removed} == expected


def test_curated_rl_chains_decontaminate_difficulty_filter_and_grpo(tmp_path):
    import mlflow

    from tests.conftest import run_cli

    home = tmp_path / "home"
    proc = run_cli("run", "curated_rl", "--profile", "tiny", env_home=home, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("posttrain/curated_rl").experiment_id
    run = {s: client.search_runs(exp, f"tags.`posttrain.stage` = '{s}'")[0] for s in ("decontam", "difficulty", "rl")}
    m = {s: r.data.metrics for s, r in run.items()}
    assert m["decontam"]["curate/rows_in"] == 192 and m["decontam"]["curate/eval_items"] > 2000
    d = m["difficulty"]
    assert d["curate/rows_in"] == m["decontam"]["curate/rows_out"]
    assert 0 < d["curate/rows_out"] < d["curate/rows_in"]  # the SFT-warmed model solves some, not all
    assert d["curate/rows_in"] == d["curate/rows_out"] + sum(v for k, v in d.items() if k.startswith("curate/removed/"))
    assert 0 < d["curate/generation_share"] <= 1 and d["curate/prompts_per_s"] > 0
    artifacts = {a.path for a in client.list_artifacts(run["difficulty"].info.run_id)}
    assert {"pass_rates.png", "report.json", "removed_examples.json"} <= artifacts
    (produced,) = [i for i in run["difficulty"].inputs.dataset_inputs
                   if {t.key: t.value for t in i.tags}["mlflow.data.context"] == "output"]
    assert produced.dataset.name == "difficulty.dataset"
    assert json.loads(produced.dataset.profile)["num_rows"] == d["curate/rows_out"]
    assert "prompt" in produced.dataset.schema
    assert m["rl"]["train/prompts"] == d["curate/rows_out"]  # GRPO trained on exactly the kept prompts
    kept = home / "stages" / "curated_rl"
    kept_rows = [json.loads(line) for p in kept.glob("difficulty-*/kept.jsonl") for line in open(p)]
    assert kept_rows and all(0 < r["pass_rate"] < 1 for r in kept_rows)


def test_no_cot_filter_removes_a_prompt_the_model_answers_without_reasoning(tmp_path):
    """SmolLM2 answers "12 + 7 = 19" with no reasoning: that prompt is guessable and goes; a
    competition-style one it cannot answer bare stays."""
    from data_curation.schema import make_row
    from pipeline.models.named import ensure_named_model

    model = str(ensure_named_model("smollm2-135m-instruct"))
    rows = [make_row(id="easy", question="What is 12 + 7?", answer="19", verifier="math", solution=None, source="t"),
            make_row(id="hard", question="Compute the number of positive divisors of 2^{10} \\cdot 3^{7} \\cdot 5^{3} "
                     "minus 17.", answer="335", verifier="math", solution=None, source="t")]
    report = curate(_cfg("no_cot_filter", model=model, tries=4, temperature=0.3, max_new_tokens=24), rows, tmp_path, model)
    assert report["removed"] == {"guessable_without_cot": 1}
    removed = [json.loads(line) for line in open(tmp_path / "removed.jsonl")]
    assert [r["id"] for r in removed] == ["easy"] and removed[0]["evidence"]["correct_tries"] >= 1
    assert [json.loads(line)["id"] for line in open(tmp_path / "kept.jsonl")] == ["hard"]


def test_coverage_is_the_share_of_an_items_tokens_inside_shared_ngrams():
    from data_curation.decontaminate import token_coverage

    item = word_ngrams("a b c d e f g h i j", 3)  # 10 words, 8 trigrams
    assert token_coverage(item, {("a", "b", "c")}, 3) == pytest.approx(0.3)
    # two overlapping trigrams cover 4 words; counting distinct n-grams would have said 2 / 8
    assert token_coverage(item, {("a", "b", "c"), ("b", "c", "d")}, 3) == pytest.approx(0.4)
    assert token_coverage(item, set(item), 3) == 1.0


def test_a_stage_leaves_out_the_questions_of_its_exclude_datasets(tmp_path):
    """qwen3's RL queries must not be its cold start's: two seeds of one source overlap (77 of 512 at
    demo sizes), so `exclude` removes the overlap by normalised question."""
    from data_curation.report import write_jsonl
    from data_curation.sources import load_rows
    from stages.grpo import GRPOConfig
    from stages.runtime import StageContext, training_rows

    first, second = load_rows("synthetic_math", n=512, seed=21), load_rows("synthetic_math", n=512, seed=3)
    ask = lambda rows: {" ".join(r["prompt"][-1]["content"].lower().split()) for r in rows}
    assert ask(first) & ask(second), "the two draws overlap: the case the option exists for"
    write_jsonl(tmp_path / "cold.jsonl", first)
    cfg = GRPOConfig(name="rl", model="m", data={"source": "synthetic_math", "n": 512, "seed": 3},
                     exclude=["cold_start.dataset"], rewards=[{"name": "accuracy_math"}])
    assert set(cfg.data_inputs()) == {"data", "exclude.0"} and ("exclude.0.source", "cold_start.dataset", "dataset") in cfg.refs()
    ctx = StageContext.local(tmp_path, {"data": cfg.data.model_dump(), "exclude.0": {"path": str(tmp_path / "cold.jsonl")}})
    rows, _ = training_rows(cfg, ctx, "RL prompt")
    assert not ask(rows) & ask(first)
    assert ctx.metrics["data/excluded_rows"] == len(second) - len(rows) > 0
