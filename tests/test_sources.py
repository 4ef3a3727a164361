"""Every data source: the common schema, determinism, disjoint held-out splits, and bad rows
(a malformed JSONL line names file:line; `on_bad_rows: skip` skips and counts)."""

import json

import pytest

from data_curation.schema import FIELDS, check_row
from data_curation.sources import SOURCES, check_data_spec, load_rows, source_fingerprint

NAMED = ["synthetic_math", "champ", "humaneval", "ifeval_synthetic", "general_chat"]


@pytest.mark.parametrize("source", NAMED)
def test_schema_determinism_and_disjoint_splits(source):
    train = load_rows(source, "train", None, seed=0)
    again = load_rows(source, "train", None, seed=0)
    held_out = load_rows(source, "eval", None, seed=0)
    assert train == again and train and held_out
    for i, row in enumerate(train + held_out):
        check_row(row, f"{source}[{i}]")
        assert set(FIELDS) <= set(row) and row["source"] == source
    questions = lambda rows: {r["prompt"][-1]["content"] for r in rows}
    assert not questions(train) & questions(held_out)
    assert len({r["id"] for r in train + held_out}) == len(train) + len(held_out)


@pytest.mark.parametrize("source", ["champ", "humaneval", "ifeval_synthetic", "general_chat"])
def test_the_seed_moves_the_split_but_never_overlaps(source):
    a, b = load_rows(source, "eval", None, seed=0), load_rows(source, "eval", None, seed=1)
    assert {r["id"] for r in a} != {r["id"] for r in b}
    assert not {r["id"] for r in b} & {r["id"] for r in load_rows(source, "train", None, seed=1)}


def test_packaged_benchmarks_load_completely():
    champ, humaneval = load_rows("champ", "all"), load_rows("humaneval", "all")
    assert len(champ) == 270 and len(humaneval) == 164
    assert champ[0]["answer"] and "<think>" in champ[0]["solution"]
    assert {r["verifier"] for r in champ} == {"math"} and {r["verifier"] for r in humaneval} == {"code"}
    assert {r["difficulty"] for r in champ} == {1, 2, 3, 4, 5}


def test_humaneval_canonical_solutions_pass_their_own_tests():
    from toolkit.rewards import get_reward

    rows = load_rows("humaneval", "all", 3)
    scores = get_reward("code_exec")(completions=[r["solution"] for r in rows], answer=[r["answer"] for r in rows])
    assert scores == [1.0, 1.0, 1.0]
    broken = [json.loads(r["answer"])["prefix"] + "    raise NotImplementedError\n" for r in rows]
    assert get_reward("code_exec")(completions=broken, answer=[r["answer"] for r in rows]) == [0.0, 0.0, 0.0]


def test_ifeval_reference_answers_satisfy_their_constraints_and_others_do_not():
    from toolkit.rewards import get_reward

    rows = load_rows("ifeval_synthetic", "train", 60)
    reward = get_reward("ifeval_constraints")
    answers = [r["answer"] for r in rows]
    assert reward(completions=[r["solution"] for r in rows], answer=answers) == [1.0] * 60
    shouted = reward(completions=[r["solution"].upper() + " EXTRA WORDS" * 30 for r in rows], answer=answers)
    assert sum(s < 1.0 for s in shouted) > 40
    kinds = {c["type"] for r in rows for c in json.loads(r["answer"])}
    assert kinds >= {"word_count", "keywords", "json", "lowercase", "bullets", "language"}


def test_ifeval_rows_with_thinking_plan_every_constraint_then_give_the_same_response():
    """`thinking: true` (qwen3's fusion data): the same prompts and constraints; the solution is a
    closed think block that names each constraint, then exactly the plain row's response."""
    from toolkit.core.text import split_thinking
    from toolkit.rewards import get_reward

    plain = load_rows("ifeval_synthetic", "train", 40)
    thinking = load_rows("ifeval_synthetic", "train", 40, params={"thinking": True})
    assert [r["prompt"] for r in thinking] == [r["prompt"] for r in plain]
    assert [r["answer"] for r in thinking] == [r["answer"] for r in plain]
    words = {"bullets": "bullet points", "json": "JSON", "lowercase": "lowercase", "ends_with": "last words",
             "keywords": "the word", "word_count": "words", "language": "English only"}
    for t, p in zip(thinking, plain):
        plan, response = split_thinking(t["solution"])
        assert plan and response == p["solution"]
        assert all(words[c["type"]] in plan for c in json.loads(t["answer"])), plan
    reward = get_reward("ifeval_constraints")  # it judges the response after </think> only
    assert reward(completions=[r["solution"] for r in thinking], answer=[r["answer"] for r in thinking]) == [1.0] * 40
    assert check_data_spec("ifeval_synthetic", {"thinking": "yes"}) == [
        (("params", "thinking"), "ifeval_synthetic: thinking must be true or false, not 'yes'")]


def test_general_chat_has_responses_and_no_gold():
    rows = load_rows("general_chat", "all")
    assert len(rows) >= 50 and all(r["solution"] and r["answer"] is None and r["verifier"] == "none" for r in rows)


def _write_jsonl(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_local_jsonl_with_column_mapping(tmp_path):
    path = _write_jsonl(tmp_path / "mine.jsonl", [
        json.dumps({"problem": f"What is {i} + {i}?", "gold": str(2 * i), "level": 2}) for i in range(40)])
    params = {"path": str(path), "columns": {"question": "problem", "answer": "gold", "difficulty": "level"}}
    rows = load_rows("file", "all", None, 0, params)
    assert len(rows) == 40 and rows[3]["answer"] == "6" and rows[3]["difficulty"] == 2
    assert rows[3]["prompt"] == [{"role": "user", "content": "What is 3 + 3?"}]
    train, held = load_rows("file", "train", None, 0, params), load_rows("file", "eval", None, 0, params)
    assert len(train) + len(held) == 40 and held
    assert source_fingerprint("file", params) != source_fingerprint(
        "file", {**params, "path": str(_write_jsonl(tmp_path / "other.jsonl", ['{"problem": "x", "gold": "1"}']))})


def test_malformed_line_names_file_and_line_or_is_skipped_and_counted(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", ['{"question": "What is 1 + 1?", "answer": "2"}',
                                                 '{"question": "What is 2 + 2?", "answer": ',
                                                 '{"question": "What is 3 + 3?"}',
                                                 '{"question": "What is 4 + 4?", "answer": "8"}'])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: malformed row"):
        load_rows("file", "all", None, 0, {"path": str(path)})
    skipped = []
    rows = load_rows("file", "all", None, 0, {"path": str(path)}, on_bad_rows="skip", skipped=skipped)
    assert [r["answer"] for r in rows] == ["2", "8"]
    assert len(skipped) == 2 and "bad.jsonl:3: verifiable row (math) has no gold answer" in skipped[1]


def test_parquet_and_saved_datasets(tmp_path):
    from datasets import Dataset

    ds = Dataset.from_list([{"question": f"Say {i}", "answer": str(i)} for i in range(5)])
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    for path in (tmp_path / "d.parquet", tmp_path / "saved"):
        assert [r["answer"] for r in load_rows("file", "all", None, 0, {"path": str(path)})] == list("01234")


def test_specs_that_cannot_load_are_refused_before_any_row_is_read(tmp_path):
    assert "does not exist" in check_data_spec("file", {"path": str(tmp_path / "none.jsonl")})[0][1]
    assert "unknown data source" in check_data_spec("champs", {})[0][1]
    assert "takes no parameter" in check_data_spec("champ", {"difficulties": [1]})[0][1]
    assert set(SOURCES) >= set(NAMED) | {"file"}


def test_recipe_data_path_shorthand(tmp_path):
    from stages.common import DataSpec

    spec = DataSpec.model_validate({"path": "x.jsonl", "columns": {"question": "q"}, "on_bad_rows": "skip"})
    assert spec.source == "file" and spec.params == {"path": "x.jsonl", "columns": {"question": "q"}}
    assert spec.on_bad_rows == "skip" and spec.stage_ref is None


def test_skipped_rows_are_counted_in_the_stage_run(tmp_path):
    import mlflow
    import yaml

    from tests.conftest import run_cli

    good = [json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1),
                        "solution": f"<think>\n{i} + 1 = {i + 1}.\n</think>\n\nThe answer is \\boxed{{{i + 1}}}."})
            for i in range(12)]
    data = _write_jsonl(tmp_path / "train.jsonl", good[:5] + ["{not json", '{"question": "no gold"}'] + good[5:])
    recipe = {"name": "bad_rows", "stages": [{
        "name": "sft", "kind": "sft", "model": "tiny-qwen3", "evaluate": False, "max_steps": 2, "max_length": 64,
        "per_device_batch_size": 4, "data": {"path": str(data), "on_bad_rows": "skip", "split": "all"}}]}
    (tmp_path / "bad_rows.yaml").write_text(yaml.safe_dump(recipe))
    home = tmp_path / "home"
    proc = run_cli("run", str(tmp_path / "bad_rows.yaml"), env_home=home, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    run = client.search_runs(client.get_experiment_by_name("posttrain/bad_rows").experiment_id,
                             "tags.`posttrain.stage` = 'sft'")[0]
    assert run.data.metrics["data/skipped_rows"] == 2.0
    assert run.data.metrics["train/rows"] == 12.0

    recipe["stages"][0]["data"]["on_bad_rows"] = "fail"
    (tmp_path / "strict.yaml").write_text(yaml.safe_dump({**recipe, "name": "strict"}))
    proc = run_cli("run", str(tmp_path / "strict.yaml"), env_home=home, timeout=600)
    assert proc.returncode != 0 and "train.jsonl:6: malformed row" in proc.stdout + proc.stderr
