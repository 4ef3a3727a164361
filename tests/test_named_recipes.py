"""The named recipes `r1`, `kimi_k15` and `qwen3` run end to end on `tiny` through the real flow
(Prefect, MLflow, worker subprocesses), and each stage does what its paper's stage asks."""

import json
from pathlib import Path

import mlflow
import pytest

from pipeline.store.home import tracking_uri
from tests.conftest import run_cli, run_named_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def r1(prefect_harness, tiny_model):
    return run_named_recipe("r1")


@pytest.fixture(scope="module")
def kimi(prefect_harness, tiny_model):
    return run_named_recipe("kimi_k15")


def _stages(result: dict) -> dict[str, dict]:
    return {s["name"]: s for s in result["stages"]}


def _out(stage: dict) -> Path:
    return Path(stage["output_dir"])


def _history(stage: dict, key: str) -> list[float]:
    client = mlflow.MlflowClient(tracking_uri())
    return [m.value for m in sorted(client.get_metric_history(stage["mlflow_run_id"], key), key=lambda m: m.step)]


def test_r1_runs_its_four_stages_and_distils(r1):
    stages = _stages(r1)
    assert list(stages) == ["cold_start", "reasoning_rl", "rs", "sft_all", "helpful_pairs", "rm_helpful",
                            "whole_pairs", "rm_whole", "all_rl", "distill"]
    # Stage 3 fine-tunes the BASE model on rejection-sampled traces mixed with non-reasoning data.
    plan = json.loads((_out(stages["sft_all"]) / "stage_config.json").read_text())
    assert Path(plan["inputs"]["model"]).name == "tiny-qwen3"
    mixture = json.loads((_out(stages["sft_all"]) / "mixture.json").read_text())
    assert [p["part"] for p in mixture] == ["rs.dataset", "synthetic_math", "general_chat"]
    assert all(p["used"] > 0 for p in mixture)
    reasoning, general = mixture[0]["used"] + mixture[1]["used"], mixture[2]["used"]
    assert 2.5 <= reasoning / general <= 3.5, mixture  # the 3:1 mixture, enforced
    run = mlflow.MlflowClient(tracking_uri()).get_run(stages["sft_all"]["mlflow_run_id"])
    logged = [d.dataset for d in run.inputs.dataset_inputs if d.dataset.name == "sft_all.mixture"]
    assert logged and json.loads(logged[0].profile)["parts"] == [[p["part"], p["used"]] for p in mixture]
    # Stage 4 scores with both reward models (summary vs whole response) next to the rules.
    m = stages["all_rl"]["metrics"]
    assert m["train/rewards/reward_model_answer/scored"] > 0 and m["train/rewards/reward_model_full/scored"] > 0
    assert _history(stages["all_rl"], "rewards/format_think/mean"), "the format rule runs on the reasoning rows"
    # The student is the profile's student, distilled from the final model.
    plan = json.loads((_out(stages["distill"]) / "stage_config.json").read_text())
    assert Path(plan["inputs"]["student"]).name == "tiny-qwen3-student"
    assert plan["inputs"]["teacher"].startswith(stages["all_rl"]["output_dir"])
    assert stages["distill"]["metrics"]["distill/traces_kept"] > 0


def test_kimi_curates_prompts_runs_mirror_descent_and_long2short(kimi):
    stages = _stages(kimi)
    assert {"decontam", "no_cot", "difficulty", "rl_curriculum", "rl", "short_dpo", "merged", "short_rl"} <= set(stages)
    plan = json.loads((_out(stages["rl_curriculum"]) / "stage_config.json").read_text())
    assert plan["config"]["loss"] == "kimi_mirror_descent" and plan["config"]["sampler"] == "curriculum"
    assert json.loads((_out(stages["rl"]) / "stage_config.json").read_text())["config"]["sampler"] == "prioritized"
    # The curriculum is paced by the prompts the stage draws; the count it was given is the trainer's.
    m = stages["rl_curriculum"]["metrics"]
    assert m["train/prompts_drawn"] == m["train/prompts_planned"] > 0
    # The length reward is off for the first steps (start_step: 2 on tiny), then on. The mirror-descent
    # loss updates twice per rollout batch, so rewards are computed at steps 0 and 2 only.
    length = _history(stages["rl_curriculum"], "rewards/length_kimi/mean")
    assert length and length[0] == 0.0
    # Long against short: every model of the long2short branch is evaluated on the same held-out set.
    for name in ("rl", "short_dpo", "merged", "short_rl"):
        assert "eval/thinking_tokens_mean" in stages[name]["metrics"] and "eval/accuracy" in stages[name]["metrics"]
    assert {"dpo/response_tokens_before", "dpo/response_tokens_after"} <= set(stages["short_dpo"]["metrics"])


def test_qwen3_fuses_thinking_modes_rewards_flags_and_distils_both_modes(qwen3):
    stages = _stages(qwen3)
    assert list(stages)[:4] == ["query_filter", "decontam", "response_filter", "cold_start"]
    for name in ("fusion", "general_rl"):
        m = stages[name]["metrics"]
        assert {"eval/mode/think/mode_compliance", "eval/mode/no_think/mode_compliance",
                "eval/budget/0/accuracy", "eval/budget/unlimited/accuracy"} <= set(m)
    # General RL: prompts with flags and instruction prompts, the flag rule on every row.
    mixture = json.loads((_out(stages["general_rl"]) / "mixture.json").read_text())
    assert [p["part"] for p in mixture] == ["fusion_data.dataset", "ifeval_synthetic"]
    assert _history(stages["general_rl"], "rewards/thinking_flag/mean")
    # Strong-to-weak: off-policy traces in both modes (2 per prompt), counted per mode, then on-policy
    # from that student.
    off = stages["distill_off"]["metrics"]
    assert off["distill/teacher_traces"] == 2 * 24
    assert off["distill/traces_kept/think"] + off["distill/traces_kept/no_think"] == off["distill/traces_kept"]
    plan = json.loads((_out(stages["distill_on"]) / "stage_config.json").read_text())
    assert plan["inputs"]["student"].startswith(stages["distill_off"]["output_dir"])
    # on-policy: unflagged prompts beside both flags (the recipe's departure), reverse KL
    assert plan["config"]["thinking_modes"] == ["think", "no_think", "default"] and plan["config"]["beta"] == 1.0
    # The pipeline's parent run compares the stages: headline bars and accuracy against budget.
    client = mlflow.MlflowClient(tracking_uri())
    artifacts = {a.path for a in client.list_artifacts(qwen3["mlflow_run_id"])}
    assert {"stage_comparison.png", "budget_curves.png", "stage_comparison.json"} <= artifacts


def test_compare_and_list_show_the_named_recipes(r1, qwen3):
    proc = run_cli("compare", r1["id"], qwen3["id"], "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert {r["recipe"] for r in rows} == {"r1", "qwen3"}
    by = {(r["recipe"], r["stage"]): r["metrics"] for r in rows}
    assert "rm/pairwise_accuracy" in by[("r1", "rm_helpful")]
    assert "eval/mode/no_think/mode_compliance" in by[("qwen3", "fusion")]
    change = {(r["recipe"], r["stage"]): r["change"] for r in rows}
    assert change[("r1", "all_rl")]["eval/accuracy"] == pytest.approx(
        by[("r1", "all_rl")]["eval/accuracy"] - by[("r1", "sft_all")]["eval/accuracy"])
    text = run_cli("compare", r1["id"], qwen3["id"]).stdout
    assert r1["id"] in text and qwen3["id"] in text and "format_rate" in text and "change accuracy" in text
    listed = run_cli("list").stdout
    assert all(name in listed for name in ("r1", "kimi_k15", "qwen3"))


def test_lineage_walks_from_the_student_back_through_every_stage_to_the_source_datasets(qwen3):
    """Each stage run records its datasets as MLflow dataset inputs and the runs of the upstream
    stages that produced its inputs; following them from the final model reaches the sources."""
    client = mlflow.MlflowClient(tracking_uri())
    seen, sources, todo = {}, set(), [_stages(qwen3)["distill_on"]["mlflow_run_id"]]
    while todo:
        run = client.get_run(todo.pop())
        if run.info.run_id in seen:
            continue
        seen[run.info.run_id] = run.data.tags["posttrain.stage"]
        for d in run.inputs.dataset_inputs:
            assert d.dataset.digest and json.loads(d.dataset.source)["uri"]
            context = {t.key: t.value for t in d.tags}["mlflow.data.context"]
            if context == "eval":  # each selection of rows is its own dataset, not the first one logged
                assert "split=eval" in json.loads(d.dataset.source)["uri"]
            if "." not in d.dataset.name:  # a source, not another stage's output
                sources.add((d.dataset.name, context))
        todo += [v for k, v in run.data.tags.items() if k.startswith("posttrain.upstream.")]
    assert {"query_filter", "decontam", "response_filter", "cold_start", "reasoning_rl", "rs", "fusion_data",
            "fusion", "general_rl", "distill_off", "distill_on"} <= set(seen.values())
    assert {("synthetic_math", "train"), ("general_chat", "train"), ("ifeval_synthetic", "train"),
            ("synthetic_math", "eval")} <= sources
    cold_start = client.get_run(_stages(qwen3)["cold_start"]["mlflow_run_id"])
    assert cold_start.data.tags["posttrain.input.model"].startswith("tiny-qwen3 (")  # `base` on the tiny profile
