"""`smoke` on `tiny` through the real Prefect flow and MLflow store, then a fully cached rerun."""

from pathlib import Path

import mlflow
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke_runs(prefect_harness, tiny_model):
    from pipeline.flow import run_recipe

    first = run_recipe("smoke", "tiny", [])
    second = run_recipe("smoke", "tiny", [])
    return first, second


def test_both_stages_complete_and_publish_whole_directories(smoke_runs):
    first, _ = smoke_runs
    assert first["status"] == "completed"
    assert [s["status"] for s in first["stages"]] == ["completed", "completed"]
    assert not any(s["cached"] for s in first["stages"])
    for s in first["stages"]:
        out = Path(s["output_dir"])
        assert (out / "model" / "model.safetensors").exists() and (out / "result.json").exists()
        assert (out / "stage_config.json").exists() and not (out / "checkpoints").exists()
        assert not out.with_name(out.name + ".partial").exists()
    # the second stage trained on the first stage's model
    polish_cfg = (Path(first["stages"][1]["output_dir"]) / "stage_config.json").read_text()
    assert first["stages"][0]["output_dir"] in polish_cfg


def test_rerun_serves_every_stage_from_cache(smoke_runs):
    first, second = smoke_runs
    assert second["status"] == "completed"
    assert [s["cached"] for s in second["stages"]] == [True, True]
    assert [s["output_dir"] for s in second["stages"]] == [s["output_dir"] for s in first["stages"]]
    assert second["stages"][1]["metrics"] == first["stages"][1]["metrics"]


def test_mlflow_parent_and_nested_stage_runs(smoke_runs, tmp_path):
    first, second = smoke_runs
    client = mlflow.MlflowClient()
    parent = client.get_run(first["mlflow_run_id"])
    assert parent.data.params["recipe"] == "smoke" and parent.data.params["profile"] == "tiny"
    assert "git_commit" in parent.data.params
    assert parent.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"stage_comparison.png", "stage_metrics.json", "stage_comparison.json"} <= artifacts
    # the cached rerun shows the same figure, drawn once ($POSTTRAIN_HOME/cache/plots) and logged again
    rerun = {a.path for a in client.list_artifacts(second["mlflow_run_id"])}
    assert "stage_comparison.png" in rerun
    first_png = client.download_artifacts(parent.info.run_id, "stage_comparison.png", str(tmp_path / "a"))
    second_png = client.download_artifacts(second["mlflow_run_id"], "stage_comparison.png", str(tmp_path / "b"))
    assert Path(first_png).read_bytes() == Path(second_png).read_bytes()
    for stage in first["stages"]:
        run = client.get_run(stage["mlflow_run_id"])
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.params["stage.name"] == stage["name"] and run.data.params["stage.max_steps"] == "24"
        loss = client.get_metric_history(run.info.run_id, "loss")
        assert len(loss) >= 3 and len({m.step for m in loss}) == len(loss)  # per-step training curve
        for key in ("eval/accuracy", "eval/format_rate", "eval/thinking_tokens_mean",
                    "eval/rewards/accuracy_math/mean", "eval/rewards/format_think/none", "eval/rewards/combined/mean"):
            assert key in run.data.metrics
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"eval_samples.json", "stage_config.json", "tokenizer"} <= names
        assert run.info.status == "FINISHED"
        assert run.data.tags["posttrain.output_dir"] == stage["output_dir"]
        assert len(run.data.tags["posttrain.model_sha256"]) == 64
    # cached stages still appear under the rerun's parent, pointing at the run that did the work
    for stage, original in zip(second["stages"], first["stages"]):
        run = client.get_run(stage["mlflow_run_id"])
        assert run.data.tags["mlflow.parentRunId"] == second["mlflow_run_id"]
        assert run.data.tags["posttrain.cached_from"] == original["mlflow_run_id"]


def test_training_moved_the_model(smoke_runs):
    first, _ = smoke_runs
    for s in first["stages"]:
        assert s["metrics"]["train/final_loss"] < s["metrics"]["train/first_loss"]


def test_changed_stage_reruns_alone(smoke_runs, prefect_harness):
    from pipeline.flow import run_recipe

    third = run_recipe("smoke", "tiny", ["stages.polish.max_steps=6"])
    assert [s["cached"] for s in third["stages"]] == [True, False]
    assert third["stages"][1]["metrics"]["train/global_step"] == 6


def test_cli_list_and_show_read_the_run_records(smoke_runs):
    from tests.conftest import run_cli

    first, second = smoke_runs
    listing = run_cli("list")
    assert listing.returncode == 0 and "smoke" in listing.stdout and second["id"] in listing.stdout
    shown = run_cli("show", first["id"])
    assert shown.returncode == 0
    assert first["stages"][0]["mlflow_run_id"] in shown.stdout and "cold_start" in shown.stdout
    assert run_cli("show", "no-such-run").returncode == 2


def test_deployments_offer_recipe_and_profile_as_choices(prefect_harness):
    from pipeline.flow import run_recipe
    from pipeline.recipe import list_profiles

    deployment = run_recipe.to_deployment(name="smoke", parameters={"recipe": "smoke", "profile": "tiny"})
    props = deployment._parameter_openapi_schema.model_dump()["properties"]
    assert props["profile"]["anyOf"][0]["enum"] == list_profiles()
    assert "smoke" in str(props["recipe"])


def test_every_evaluated_stage_is_compared_with_its_input_model(smoke_runs):
    first, second = smoke_runs
    cold, polish = first["stages"]
    # cold_start starts from the base model: the worker evaluated it once (cached for the rerun).
    assert {"input/eval/accuracy", "input/eval/format_rate"} <= set(cold["metrics"])
    assert second["stages"][0]["metrics"]["input/eval/format_rate"] == cold["metrics"]["input/eval/format_rate"]
    # polish starts from cold_start: its input numbers are cold_start's evaluation.
    assert polish["metrics"]["input/eval/format_rate"] == cold["metrics"]["eval/format_rate"]
    client = mlflow.MlflowClient(f"sqlite:///{Path(__import__('os').environ['POSTTRAIN_HOME']) / 'mlflow.db'}")
    assert "input/eval/format_rate" in client.get_run(polish["mlflow_run_id"]).data.metrics


def test_a_gate_stops_with_both_numbers_or_warns_with_a_tag(smoke_runs, prefect_harness):
    from pipeline.flow import run_recipe
    from pipeline.gates import GateFailed
    from pipeline.store import runs
    from pipeline.tracking.mlflow_runs import GATE_TAG, client

    impossible = "stages.polish.gate={metric: format_rate, min_delta: 2.0, on_fail: %s}"
    with pytest.raises(GateFailed, match=r"eval/format_rate \S+ against the input model's \S+ \(change"):
        run_recipe("smoke", "tiny", [impossible % "stop"])
    stopped = runs.find("latest")
    assert stopped["status"] == "failed"
    polish = stopped["stages"][1]
    assert polish["status"] == "gate_failed" and polish["cached"], "a gate is not part of the cache key"
    assert client().get_run(polish["mlflow_run_id"]).data.tags[GATE_TAG] == polish["gate"]

    warned = run_recipe("smoke", "tiny", [impossible % "warn"])
    assert warned["status"] == "completed" and "the gate asks for at least +2" in warned["stages"][1]["gate"]
    assert GATE_TAG in client().get_run(warned["stages"][1]["mlflow_run_id"]).data.tags
    passed = run_recipe("smoke", "tiny", ["stages.polish.gate={metric: format_rate, min_delta: -1.0}"])
    assert passed["status"] == "completed" and "gate" not in passed["stages"][1]
