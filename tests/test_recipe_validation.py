"""Bad recipes are refused with their YAML path (and file:line where there is one), before any compute."""

from pathlib import Path

import pytest
import yaml

from pipeline.recipe import RecipeError, list_recipes, load_recipe
from tests.conftest import REPO, run_cli

SMOKE = REPO / "recipes" / "smoke.yaml"


def write_variant(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load(SMOKE.read_text())
    mutate(data)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def refused(path_or_name, profile="tiny", overrides=()) -> str:
    with pytest.raises(RecipeError) as e:
        load_recipe(str(path_or_name), profile, list(overrides))
    return str(e.value)


def test_every_shipped_recipe_validates_on_every_profile_that_fits_offline():
    for name in list_recipes():
        resolved = load_recipe(name, "tiny")
        assert resolved.recipe.stages


def test_profile_and_set_layering():
    r = load_recipe("smoke", "tiny", ["stages.polish.max_steps=7", "eval.max_new_tokens=12"])
    cold, polish = r.recipe.stages
    assert cold.model == "tiny-qwen3"  # the `base` alias, mapped by the profile
    assert cold.max_steps == 24 and polish.max_steps == 7  # profile, then --set
    assert polish.model == "cold_start.model"
    assert r.recipe.eval.max_new_tokens == 12


def test_set_reaches_list_items_by_index_and_names_a_path_that_is_not_there():
    r = load_recipe("r1_zero", "tiny", ["stages.zero_rl.rewards.1.weight=0.25"])
    assert r.recipe.stages[0].rewards[1].weight == 0.25
    for bad in ("stages.zero_rl.rewards.9.weight=1", "stages.zero_rl.rewards.first.weight=1",
                "stages.zero_rl.rewards.-1.weight=1", "stages.zero_rl.max_steps.x=1"):
        with pytest.raises(RecipeError, match=f"--set {bad.split('=')[0]}: no such field path"):
            load_recipe("r1_zero", "tiny", [bad])


def test_an_error_inside_a_replaced_value_names_what_replaced_it():
    """kimi_k15's cold start data has its own `params` line; a --set that replaces the whole `data`
    must be named for an error under it, not the recipe line it replaced."""
    bad = "stages.cold_start.data={source: synthetic_math, n: 64, params: {rechecks: 9}}"
    with pytest.raises(RecipeError, match=r"--set stages\.cold_start\.data=.*rechecks must be a whole number"):
        load_recipe("kimi_k15", "tiny", [bad])


def test_fusion_cut_thoughts_must_end_with_the_evaluations_stop_string():
    with pytest.raises(RecipeError, match=r"stop_thinking: cut thoughts end with another string"):
        load_recipe("qwen3", "tiny", ["stages.fusion_data.stop_thinking=Time is up.</think>"])


def test_unknown_top_level_field_names_file_line_and_field(tmp_path):
    p = write_variant(tmp_path, lambda d: d.update(bogus_top=1))
    msg = refused(p)
    assert "bogus_top" in msg and "unknown field" in msg and "variant.yaml:" in msg


def test_unknown_stage_field_has_yaml_path(tmp_path):
    p = write_variant(tmp_path, lambda d: d["stages"][1].update(bogus_stage_field=1))
    assert "stages[1].bogus_stage_field: unknown field" in refused(p)


def test_wrong_type_is_reported_even_where_the_profile_overrides_it(tmp_path):
    p = write_variant(tmp_path, lambda d: d["stages"][0].update(max_steps="many"))
    msg = refused(p)
    assert "stages[0].max_steps" in msg and "integer" in msg


def test_reference_to_missing_stage(tmp_path):
    p = write_variant(tmp_path, lambda d: d["stages"][1].update(model="nosuch.model"))
    assert "stages[1].model: 'nosuch.model' names no stage" in refused(p)


def test_reference_to_later_stage(tmp_path):
    p = write_variant(tmp_path, lambda d: d["stages"][0].update(model="polish.model"))
    assert "runs later" in refused(p)


def test_reference_to_an_output_the_stage_does_not_make(tmp_path):
    p = write_variant(tmp_path, lambda d: d["stages"][1].update(data={"source": "cold_start.dataset"}))
    assert "produces ['model'], not 'dataset'" in refused(p)


def test_unknown_stage_kind(tmp_path):
    p = write_variant(tmp_path, lambda d: d["stages"][0].update(kind="no_such_kind"))
    msg = refused(p)
    assert "stages[0]: unknown stage kind 'no_such_kind'" in msg and "sft" in msg


def test_unknown_dataset_source_and_parameter(tmp_path):
    def mutate(d):
        d["stages"][0]["data"] = {"source": "no_such_source"}
        d["stages"][1]["data"]["params"] = {"colour": "red"}
    msg = refused(write_variant(tmp_path, mutate))
    assert "stages[0].data.source: unknown data source 'no_such_source'" in msg
    assert "stages[1].data.params.colour" in msg


def test_unknown_reward_name_and_bad_reward_params(tmp_path):
    def mutate(d):
        d["eval"]["rewards"] = [{"name": "no_such_reward"}, {"name": "overlong_dapo", "params": {"colour": 1}}]
    msg = refused(write_variant(tmp_path, mutate))
    assert "eval.rewards[0].name: unknown reward 'no_such_reward'" in msg
    assert "eval.rewards[1].params" in msg


def test_unknown_profile():
    assert "profile 'huge' not found" in refused("smoke", profile="huge")


def test_missing_model_path_is_named(tmp_path):
    missing = tmp_path / "no" / "model"
    assert str(missing) in refused("smoke", overrides=[f"stages.cold_start.model={missing}"])


def test_an_mlflow_uri_that_names_nothing_is_refused_with_its_path():
    msg = refused("smoke", overrides=["stages.cold_start.model=models:/no-such-model@candidate"])
    assert "stages[0].model: models:/no-such-model@candidate: not found in the MLflow store" in msg
    msg = refused("smoke", overrides=["stages.polish.model=runs:/0123abc/model"])
    assert "stages[1].model: runs:/0123abc/model: not found" in msg


def test_duplicate_stage_names(tmp_path):
    p = write_variant(tmp_path, lambda d: d["stages"][1].update(name="cold_start", model="base"))
    assert "duplicate stage name 'cold_start'" in refused(p)


def test_set_of_unknown_stage_is_refused():
    assert "stages are cold_start, polish" in refused("smoke", overrides=["stages.nope.max_steps=3"])


def test_ranks_without_deepspeed_and_missing_deepspeed_config():
    assert "needs mode: deepspeed" in refused("smoke", overrides=["stages.polish.launcher.ranks=2"])
    msg = refused("smoke", overrides=["stages.polish.launcher.mode=deepspeed",
                                      "stages.polish.launcher.deepspeed_config=zero9"])
    assert "stages[1].launcher.deepspeed_config" in msg


def test_all_errors_are_listed_together(tmp_path):
    def mutate(d):
        d["stages"][0]["bogus"] = 1
        d["stages"][1]["max_steps"] = "x"
    msg = refused(write_variant(tmp_path, mutate))
    assert "stages[0].bogus" in msg and "stages[1].max_steps" in msg


def test_invalid_yaml_names_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nstages:\n  - name: a\n    kind: [unclosed\n")
    assert "broken.yaml:" in refused(p) and "invalid YAML" in refused(p)


def test_cli_validate_exit_codes(tmp_path):
    ok = run_cli("validate", "smoke", "--profile", "tiny")
    assert ok.returncode == 0, ok.stderr
    bad = write_variant(tmp_path, lambda d: d["stages"][0].update(kind="no_such_kind"))
    res = run_cli("validate", str(bad), "--profile", "tiny")
    assert res.returncode == 2 and "no_such_kind" in res.stderr
    res = run_cli("run", str(bad), "--profile", "tiny")  # `run` refuses before Prefect starts
    assert res.returncode == 2 and "no_such_kind" in res.stderr and "Starting temporary server" not in res.stdout + res.stderr


def test_sft_mixture_inputs_are_checked_with_their_paths(tmp_path):
    def mutate(d):
        d["stages"][1]["data"] = None
        d["stages"][1]["mix"] = [{"data": {"source": "cold_start.dataset"}, "count": 10},
                                 {"data": {"source": "no_such_source"}, "weight": 0.5}]
    msg = refused(write_variant(tmp_path, mutate))
    assert "stages[1].mix[0].data.source: stage 'cold_start' (sft) produces ['model'], not 'dataset'" in msg
    assert "stages[1].mix[1].data.source" in msg and "no_such_source" in msg

    def both(d):
        d["stages"][1]["mix"] = [{"data": {"source": "general_chat"}, "count": 10, "weight": 2.0}]
    assert "stages[1].mix[0]: Value error, give a part one of count, weight and ratio" in refused(write_variant(tmp_path, both))

    def data_and_mix(d):
        d["stages"][1]["mix"] = [{"data": {"source": "general_chat"}}]
    assert "exactly one of `data` (one dataset) and `mix`" in refused(write_variant(tmp_path, data_and_mix))


def test_retraining_the_base_model_after_other_stages(tmp_path):
    """R1 stage 3 fine-tunes the BASE model on a mixture built from later stages' outputs."""
    def mutate(d):
        d["stages"].append({"name": "rs", "kind": "rejection_sample", "model": "polish.model",
                            "data": {"source": "synthetic_math", "n": 8}})
        d["stages"].append({"name": "final", "kind": "sft", "model": "base", "mix": [
            {"data": "rs.dataset"}, {"data": {"source": "general_chat"}, "weight": 0.5}]})
    r = load_recipe(str(write_variant(tmp_path, mutate)), "tiny")
    final = r.recipe.stages[-1]
    assert final.model == "tiny-qwen3" and list(final.data_inputs()) == ["mix.0.data", "mix.1.data"]
    assert ("mix.0.data.source", "rs.dataset", "dataset") in final.refs()


def test_preference_inputs_must_be_pairs(tmp_path):
    data = yaml.safe_load((REPO / "recipes" / "rlhf_smoke.yaml").read_text())
    data["stages"][2]["pairs"] = {"source": "synthetic_math"}
    data["stages"][3]["pairs"] = "cold_start.model"
    path = tmp_path / "bad_pairs.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    msg = refused(path)
    assert "stages[2].pairs.source: preference pairs come from a stage's `pairs` output or a local file" in msg
    assert "stages[3].pairs.source: 'cold_start.model' is a stage's `model` output; this field takes `<stage>.pairs`" in msg


def test_a_gate_needs_an_evaluated_stage_with_one_input_model():
    msg = refused("smoke", overrides=["stages.cold_start.evaluate=false", "stages.cold_start.gate={metric: accuracy}"])
    assert "stages[0].gate" in msg and "not evaluated" in msg
    msg = refused("rlhf_smoke", overrides=["stages.merged.gate={metric: accuracy}"])
    assert "stages[5].gate" in msg and "no single input model" in msg
    recipe = load_recipe("smoke", "tiny", ["stages.polish.gate={metric: accuracy, min_delta: 0.05, on_fail: warn}"]).recipe
    assert recipe.stages[1].gate.metric == "eval/accuracy"  # the shorthand names the held-out metric
    msg = refused("qwen3", overrides=["stages.fusion.evaluate=greedy", "stages.fusion.gate={metric: eval/mode/think/accuracy}"])
    assert "stages[7].gate" in msg and "evaluate: greedy" in msg  # a sweep metric a greedy-only stage never measures


def test_multi_node_and_rollout_server_settings_are_checked(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("gpu-a slots=8\n# a spare\ngpu-b slots=8  # rack 2\n")
    ds = ["stages.polish.launcher.mode=deepspeed"]
    r = load_recipe("smoke", "tiny", ds + [f"stages.polish.launcher.nodes={hostfile}", "stages.polish.launcher.no_ssh=true"])
    assert r.recipe.stages[1].launcher.nodes == ["gpu-a slots=8", "gpu-b slots=8"]  # read once: the plan carries it
    assert f"stages[1].launcher.nodes: no hostfile at {tmp_path / 'nope'}" in \
        refused("smoke", overrides=ds + [f"stages.polish.launcher.nodes={tmp_path / 'nope'}"])
    assert "'gpu-a' is not a hostfile line `<host> slots=<N>`" in \
        refused("smoke", overrides=ds + ["stages.polish.launcher.nodes=[gpu-a]"])
    assert "host 'a' is listed twice" in refused("smoke", overrides=ds + ["stages.polish.launcher.nodes=[a slots=1, a slots=2]"])
    assert "multi-node stages run under mode: deepspeed" in \
        refused("smoke", overrides=["stages.polish.launcher.nodes=[a slots=1]"])
    assert "each host's slots are its ranks; remove ranks" in \
        refused("smoke", overrides=ds + ["stages.polish.launcher.ranks=2", "stages.polish.launcher.nodes=[a slots=2]"])
    assert "no_ssh applies to a multi-node launch" in refused("smoke", overrides=ds + ["stages.polish.launcher.no_ssh=true"])
    msg = refused("smoke", overrides=["stages.polish.launcher.rollout_server={gpus: 1}"])
    assert "stages[1].launcher.rollout_server: a rollout server serves `rollout: vllm_server` stages" in msg
    msg = refused("curated_rl", overrides=["stages.rl.rollout=vllm_server"])
    assert "launcher.rollout_server: rollout: vllm_server needs launcher.rollout_server" in msg
    msg = refused("curated_rl", overrides=["stages.rl.rollout=vllm_server", "stages.rl.launcher={mode: deepspeed, ranks: 7, "
                                           "gpus_per_node: 8, rollout_server: {gpus: 2}}"])
    assert "the rollout server's 2 GPU(s) plus 7 trainer rank(s) exceed gpus_per_node 8" in msg
    assert "tensor_parallel_size 2 does not divide the server's 3 GPUs" in \
        refused("curated_rl", overrides=["stages.rl.launcher.rollout_server={gpus: 3, tensor_parallel_size: 2}"])


def test_the_cache_key_keeps_a_launchs_shape_not_its_addresses():
    from stages.launch import LaunchSpec, launch_key

    def key(**fields):
        return launch_key(LaunchSpec(mode="deepspeed", **fields))

    pods = key(nodes=["pod-0 slots=8", "pod-1 slots=8"], no_ssh=True, master_addr="pod-0", master_port=29500)
    assert pods == key(nodes=["job7-0 slots=8", "job7-1 slots=8"], no_ssh=True, master_port=29611,
                       node_timeout_s=600, timeout_s=3600)  # a resubmitted job finds the same output and resumes
    assert pods != key(nodes=["pod-0 slots=8", "pod-1 slots=4"])
    assert key(ranks=2) != key(ranks=4) and key(ranks=2) != key(ranks=2, deepspeed_config="zero3")
    # one process either way: the suite's in-process recipe runs are served to a later subprocess launch
    assert launch_key(LaunchSpec(mode="inprocess")) == launch_key(LaunchSpec()) != launch_key(LaunchSpec(mode="deepspeed"))


def test_earnability_passes_are_remembered_between_processes(tmp_path, monkeypatch):
    """A passing probe is saved under POSTTRAIN_HOME per reward-code fingerprint, so the next process
    skips the verifier pool; failures are never saved (test_unknown_reward... and r1_zero's checks)."""
    import json

    from pipeline.store.probe_cache import cache_file
    from toolkit.rewards import earnable

    monkeypatch.setenv("POSTTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(earnable, "_EARNED", set())
    load_recipe("smoke", "tiny")
    saved = json.loads(cache_file().read_text())
    assert any(key[0] == "accuracy_math" for key in saved)

    monkeypatch.setattr(earnable, "_EARNED", set())  # a new process: nothing in memory

    def no_scoring(*args, **kwargs):
        raise AssertionError("a remembered probe was scored again")

    monkeypatch.setattr(earnable, "get_reward", no_scoring)
    load_recipe("smoke", "tiny")


def test_a_student_with_another_tokenizer_is_refused_before_anything_runs(tmp_path, tiny_model):
    """Named models compare by tokenizer family (nothing built), directories by their tokenizer.json,
    and a stage's model by the model it trained, followed back."""
    import transformers

    other = tmp_path / "other"
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_model))
    tok.add_tokens(["<extra_token>"])
    tok.save_pretrained(other)
    transformers.AutoConfig.from_pretrained(str(tiny_model)).save_pretrained(other)
    assert load_recipe("rlhf_smoke", "tiny")  # tiny-qwen3 teaches tiny-qwen3-student: one family

    msg = refused("rlhf_smoke", overrides=["stages.distill_off.student=smollm2-135m-student"])
    assert ("stages[6].student: student smollm2-135m-student and teacher merged.model have different tokenizers "
            "(its smollm2 tokenizer vs tiny-qwen3's tiny-bpe tokenizer)") in msg
    msg = refused("rlhf_smoke", overrides=[f"stages.distill_off.student={other}"])
    assert f"student {other} and teacher merged.model have different tokenizers" in msg
    assert load_recipe("rlhf_smoke", "tiny", [f"stages.distill_off.student={tiny_model}"])


ENVIRONMENT = ("vLLM rollouts need", "need a GPU", "Hugging Face cache", "HF_HUB_OFFLINE", "CUDA")


@pytest.mark.parametrize("profile", ["tiny", "demo", "gpu"])
@pytest.mark.parametrize("recipe", ["r1", "kimi_k15", "qwen3"])
def test_every_named_recipe_keeps_its_semantics_on_every_profile(recipe, profile):
    """The gpu profile cannot validate on a CPU machine for environment reasons alone (no vLLM, no GPU,
    hub models); anything else is a recipe the profile broke. Kimi's long2short RL keeps a rollout
    length well below the long model's on every profile."""
    try:
        resolved = load_recipe(recipe, profile)
    except RecipeError as e:
        semantic = [line for line in e.errors if not any(m in line for m in ENVIRONMENT)]
        assert profile == "gpu" and not semantic, semantic
        return
    if recipe == "kimi_k15":
        stages = {s.name: s for s in resolved.recipe.stages}
        assert stages["short_rl"].max_completion_length * 2 <= stages["rl"].max_completion_length


def test_the_gpu_profile_leaves_kimi_its_hf_rollouts_and_short_rollouts():
    from pipeline.recipe import _apply_profile, _read_yaml, load_profile, recipe_path

    data, where = _read_yaml(recipe_path("kimi_k15"))
    profile, pwhere, pfile = load_profile("gpu")
    assert _apply_profile(data, where, "gpu", profile, pwhere, pfile, recipe_path("kimi_k15")) == []
    stages = {s["name"]: s for s in data["stages"]}
    assert {stages[n]["rollout"] for n in ("rl_curriculum", "rl", "short_rl")} == {"hf"}
    assert stages["short_rl"]["max_completion_length"] * 2 <= stages["rl"]["max_completion_length"]


def test_dapo_filters_groups_by_accuracy_by_default():
    from stages.grpo import GRPOConfig

    base = {"name": "rl", "kind": "grpo", "model": "m", "data": "synthetic_math", "rewards": [{"name": "accuracy_math"}]}
    assert GRPOConfig.model_validate({**base, "loss": "dapo"}).effective("dynamic_sampling_by") == "accuracy"
    assert GRPOConfig.model_validate({**base, "loss": "grpo"}).effective("dynamic_sampling_by") == "reward"
    chosen = GRPOConfig.model_validate({**base, "loss": "dapo", "dynamic_sampling_by": "reward"})
    assert chosen.effective("dynamic_sampling_by") == "reward"


def test_r1_runs_the_revised_papers_rl_settings():
    stages = {s["name"]: s for s in yaml.safe_load((REPO / "recipes" / "r1.yaml").read_text())["stages"]}
    for name in ("reasoning_rl", "all_rl"):
        assert stages[name]["beta"] == 0.001 and stages[name]["ref_reset_steps"] == 400
    assert stages["reasoning_rl"]["temperature"] == 1.0 and stages["all_rl"]["temperature"] == 0.7
    general = [r for r in stages["all_rl"]["rewards"] if r["name"] == "reward_model"]
    assert general and all(r["start_step"] == stages["all_rl"]["max_steps"] - 24 for r in general)  # last 400 of 1700
    demo = {s.name: s for s in load_recipe("r1", "demo").recipe.stages}["all_rl"]
    assert all(r.start_step == demo.max_steps - 3 for r in demo.rewards if r.name == "reward_model")


def test_kimi_merges_the_long_model_with_its_short_dpo_model_and_says_so():
    text = (REPO / "recipes" / "kimi_k15.yaml").read_text()
    merged = next(s for s in yaml.safe_load(text)["stages"] if s["name"] == "merged")
    assert merged["models"] == ["rl.model", "short_dpo.model"]
    assert "SEPARATELY trained short-CoT model" in text  # the departure from Kimi 2.4, declared in the header
