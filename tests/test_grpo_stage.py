"""The grpo stage with real TRL on the tiny model: dynamic sampling refills groups, the sampler's
state resumes from checkpoints, bad RL configs are refused up front, and r1_zero runs end to end
with per-step reward metrics in MLflow."""

import json
import shutil
import zlib
from pathlib import Path

import pytest

from pipeline.recipe import RecipeError, load_recipe
from stages.grpo import GRPOConfig
from tests.conftest import ort_last_logits, run_cli


def _varied_unless_easy(completions, _index, **_):
    """Prompts 0-3 always score 1 (a zero-variance group); others score by a hash of the text."""
    return [1.0 if i < 4 else (zlib.crc32(str(c).encode()) % 1000) / 1000 for c, i in zip(completions, _index)]


def _trainer(tiny_model, tmp_path, reward, max_rounds=4):
    from datasets import Dataset

    from stages.grpo import trl_config
    from stages.grpo_trainer import PosttrainGRPOTrainer, RLOptions
    from stages.prompt_sampler import PromptSampler
    from stages.runtime import StageContext

    cfg = GRPOConfig(name="rl", model="base", data="synthetic_math", loss="dapo", rewards=[{"name": "format_think"}],
                     num_generations=2, per_device_batch_size=4, max_completion_length=6)
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "_index": i} for i in range(8)]
    # curriculum over these difficulties: the first two batches hold only the always-solved prompts
    sampler = PromptSampler("curriculum", 8, difficulty=[0, 0, 0, 0, 1, 1, 1, 1])
    rl = RLOptions(sampler=sampler, success_reward=0, loss="dapo", dynamic_sampling=True, max_rounds=max_rounds)
    trainer = PosttrainGRPOTrainer(model=str(tiny_model), args=trl_config(cfg, StageContext.local(tmp_path)),
                                   train_dataset=Dataset.from_list(rows), reward_funcs=[reward], rl=rl)
    trainer.model.train()
    return trainer


def test_dynamic_sampling_drops_zero_variance_groups_and_refills(tiny_model, tmp_path):
    trainer = _trainer(tiny_model, tmp_path, _varied_unless_easy)
    batch = trainer._generate_and_score_completions([{}] * 4)  # one local rollout batch: 2 prompts x 2
    assert batch["completion_ids"].shape[0] == 4 and batch["advantages"].shape == (4,)
    groups = batch["advantages"].view(2, 2)
    assert (groups.abs().sum(dim=1) > 0).all()  # both groups carry a gradient
    assert trainer._metrics["train"]["dynamic_sampling/rounds"][-1] == 3.0  # 2 useless rounds, then a full one
    assert trainer._metrics["train"]["dynamic_sampling/informative_frac"][-1] == 1.0
    assert batch["num_items_in_batch"].item() == batch["completion_mask"].sum().item()
    assert trainer.rl.sampler.attempts.sum() == 12  # 3 rounds x 2 prompts x 2 completions recorded


def test_dynamic_sampling_gives_up_after_max_rounds(tiny_model, tmp_path):
    def constant(completions, **_):
        return [0.5] * len(completions)
    trainer = _trainer(tiny_model, tmp_path, constant, max_rounds=2)
    batch = trainer._generate_and_score_completions([{}] * 4)
    assert batch["completion_ids"].shape[0] == 4  # still a full batch, of groups that contribute nothing
    assert batch["advantages"].abs().max().item() == 0.0
    assert trainer._metrics["train"]["dynamic_sampling/rounds"][-1] == 2.0
    assert trainer._metrics["train"]["dynamic_sampling/informative_frac"][-1] == 0.0


def _run_stage(cfg, tiny_model, out):
    from stages.grpo import run
    from stages.runtime import StageContext

    out.mkdir(parents=True, exist_ok=True)
    spec = {"inputs": {"model": str(tiny_model),
                       "data": {"source": "synthetic_math", "split": "train", "n": 12, "seed": 0, "params": {}}}}
    return run(cfg, StageContext.local(out, spec["inputs"])).model_dump()


def test_prioritized_sampler_resumes_its_schedule_from_a_checkpoint(tiny_model, tmp_path):
    cfg = GRPOConfig(name="rl", model="base", data="synthetic_math", rewards=[{"name": "accuracy_math"}],
                     sampler="prioritized", num_generations=2, per_device_batch_size=4, max_completion_length=6,
                     max_steps=4, save_steps=2, learning_rate=1e-4, evaluate=False)
    first = tmp_path / "uninterrupted"
    result = _run_stage(cfg, tiny_model, first)
    assert result["metrics"]["train/global_step"] == 4.0
    assert (first / "rl_curves.png").stat().st_size > 0
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(first / "checkpoints" / "checkpoint-2", resumed / "checkpoints" / "checkpoint-2")
    result = _run_stage(cfg, tiny_model, resumed)
    assert result["metrics"]["train/resumed_from_step"] == 2.0
    state = lambda d: json.loads((d / "checkpoints" / "checkpoint-4" / "sampler_state.json").read_text())
    a, b = state(first), state(resumed)
    assert sum(a["attempts"]) == 4 * 2 * 2  # 4 steps x 2 prompts x 2 completions
    assert a == b  # same draws, same success table, same RNG position as the run that never stopped


@pytest.mark.parametrize("lora", [False, True])
def test_ort_rollouts_sample_from_the_policy_as_it_trains(tiny_model, tmp_path, lora):
    """`rollout: ort` through TRL's rollout_func: every step's rollouts come after a refresh of the
    graph's weights, and a rollout after training decodes with the trained weights (the logits HF
    gives for them), not the starting ones. With LoRA, the graph holds the adapters merged in. The
    log-probabilities run over length buckets, as the demo profile runs this stage."""
    import numpy as np
    import torch
    from datasets import Dataset

    from stages.grpo import trl_config
    from stages.grpo_trainer import PosttrainGRPOTrainer, RLOptions
    from stages.ort_rollouts import OrtRollouts
    from stages.prompt_sampler import PromptSampler
    from stages.runtime import StageContext, lora_config

    cfg = GRPOConfig(name="rl", model="base", data="synthetic_math", rewards=[{"name": "format_think"}], rollout="ort",
                     num_generations=2, per_device_batch_size=4, max_completion_length=8, max_steps=2,
                     learning_rate=1e-2, save_steps=100, evaluate=False, lora={"r": 4, "dropout": 0} if lora else None)
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "_index": i} for i in range(8)]
    workdir = tmp_path / ".ort-policy-rank0"  # as the stage names it: a killed attempt's copy is cleared
    (workdir / "ort-policy").mkdir(parents=True)
    (workdir / "ort-policy" / "model.onnx.data").write_bytes(b"left by a killed worker")
    rollout = OrtRollouts(str(tiny_model), None, 1.0, 1.0, 8, 0, 1, workdir=workdir)
    assert list(workdir.iterdir()) == []
    rl = RLOptions(sampler=PromptSampler("random", 8), success_reward=0, length_bucket_rows=2)
    trainer = PosttrainGRPOTrainer(model=str(tiny_model), args=trl_config(cfg, StageContext.local(tmp_path)),
                                   train_dataset=Dataset.from_list(rows), reward_funcs=[_varied_unless_easy], rl=rl,
                                   rollout_func=rollout, peft_config=lora_config(cfg))
    assert hasattr(trainer.model, "peft_config") == lora
    with torch.no_grad():  # as a trainer resumed from a checkpoint: its weights are not model_dir's
        next(trainer.model.parameters()).mul_(1.5)
    try:
        trainer.train()
        refreshes = [h["rollout/refresh_s"] for h in trainer.state.log_history if "rollout/refresh_s" in h]
        assert len(refreshes) == 2 and all(r > 0 for r in refreshes)
        out = rollout([rows[0]["prompt"]] * 2, trainer)  # step 2 now: the trained weights go in first
        assert len(out["completion_ids"]) == 2 and all(1 <= len(c) <= 8 for c in out["completion_ids"])
        ids = out["prompt_ids"][0]
        with torch.no_grad():
            hf = trainer.model(torch.tensor([ids])).logits[0, -1].numpy()
        assert rollout.step == 2
        np.testing.assert_allclose(ort_last_logits(rollout.model, ids), hf, atol=1e-4)
        from transformers import AutoModelForCausalLM
        with torch.no_grad():
            start = AutoModelForCausalLM.from_pretrained(str(tiny_model))(torch.tensor([ids])).logits[0, -1].numpy()
        assert np.abs(hf - start).max() > 1e-2  # training moved the policy, so the check above could fail
        assert (workdir / "ort-policy" / "model.onnx.data").stat().st_size > 1000
    finally:
        rollout.close()
    assert not workdir.exists()


@pytest.mark.parametrize("override,where,message", [
    ("stages.zero_rl.success_reward=nope", "stages[0].success_reward", "not one of this stage's rewards"),
    ("stages.zero_rl.rollout=vllm_colocate", "stages[0].rollout", "vLLM"),
    ("stages.zero_rl.template=plain", "stages[0].template", "unknown template"),
    ("stages.zero_rl.num_generations=3", "stages[0]", "multiple of num_generations"),
    ("stages.zero_rl.rewards=[{name: accuracy_mth}]", "stages[0].rewards[0].name", "unknown reward"),
    ("stages.zero_rl.ref_reset_steps=5", "stages[0]", "needs beta > 0"),
    ("stages.zero_rl.rollout=ort", "stages[0].rollout", "not with ZeRO-3's sharded weights"),
])
def test_bad_rl_config_is_refused_with_its_path(override, where, message):
    sets = [override] + (["stages.zero_rl.beta=0"] if "ref_reset" in override else []) + (
        ["stages.zero_rl.launcher={mode: deepspeed, deepspeed_config: zero3}"] if "ort" in override else [])
    with pytest.raises(RecipeError) as e:
        load_recipe("r1_zero", "tiny", sets)
    assert where in str(e.value) and message in str(e.value)


def test_paper_defaults_per_variant():
    base = dict(name="rl", model="m", data="synthetic_math", rewards=[{"name": "accuracy_math"}])
    dapo = GRPOConfig(**base, loss="dapo")
    assert (dapo.effective("beta"), dapo.effective("clip_high"), dapo.effective("dynamic_sampling"),
            dapo.effective("mask_truncated")) == (0.0, 0.28, True, True)
    grpo = GRPOConfig(**base, loss="grpo")
    assert (grpo.effective("beta"), grpo.effective("clip_high"), grpo.effective("scale_rewards")) == (0.04, 0.2, True)
    assert GRPOConfig(**base, loss="dr_grpo").effective("scale_rewards") is False
    assert GRPOConfig(**base, loss="dapo", dynamic_sampling=False).effective("dynamic_sampling") is False
    soft = GRPOConfig(**{**base, "rewards": [{"name": "accuracy_math"}, {"name": "overlong_dapo"}]}, loss="dapo")
    assert soft.effective("mask_truncated") is False  # the soft punishment replaces overlong masking


def test_a_reward_with_a_start_step_is_zero_before_it():
    from types import SimpleNamespace

    from stages.common import RewardSpec
    from stages.grpo import stage_reward

    reward = stage_reward(RewardSpec(name="format_think", start_step=10))
    good = ["<think>a</think> b"] * 2
    assert reward(completions=good, trainer_state=SimpleNamespace(global_step=9)) == [0.0, 0.0]
    assert reward(completions=good, trainer_state=SimpleNamespace(global_step=10)) == [1.0, 1.0]
    assert reward.__name__ == "format_think"  # TRL names the per-reward metric after it


def test_in_a_mixture_a_verifier_reward_judges_only_its_own_rows():
    import pickle

    from stages.common import RewardSpec
    from stages.grpo import stage_reward

    accuracy = pickle.loads(pickle.dumps(stage_reward(RewardSpec(name="accuracy_math"))))
    # The instruction row's gold is a constraint list: read as a math answer, "3" would match it.
    out = accuracy(completions=["\\boxed{3}", "\\boxed{3}", "\\boxed{4}"], answer=["3", "3", "3"],
                   verifier=["math", "ifeval", "math"], language=["en"] * 3)
    assert out == [1.0, None, 0.0]
    flags = stage_reward(RewardSpec(name="thinking_flag"))  # not a verifier's reward: judges every row
    prompts = [[{"role": "user", "content": "hi /no_think"}], [{"role": "user", "content": "hi"}]]
    assert flags(prompts=prompts, completions=["<think>\n\n</think>\n\nhello", "<think>\n\n</think>\n\nhello"],
                 verifier=["none", "math"]) == [1.0, 0.0]
    math_format = stage_reward(RewardSpec(name="format_think", only=["math"]))  # R1 stage 4: no CoT on chat rows
    assert math_format(completions=["<think>a</think> b", "hello"], verifier=["math", "none"]) == [1.0, None]


def test_r1_zero_end_to_end_logs_reward_curves(tmp_path):
    import mlflow

    home = tmp_path / "home"
    proc = run_cli("run", "r1_zero", "--profile", "tiny", "--set", "stages.zero_rl.log_completions=true",
                   env_home=home, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    runs = client.search_runs(client.get_experiment_by_name("posttrain/r1_zero").experiment_id,
                              "tags.`posttrain.stage` = 'zero_rl'")
    assert len(runs) == 1
    run_id = runs[0].info.run_id
    for key in ("reward", "rewards/accuracy_math/mean", "rewards/format_think/mean", "completions/mean_length",
                "kl", "entropy", "frac_reward_zero_std", "rollout/tokens_per_s", "train/tokens_per_s", "accuracy"):
        assert len(client.get_metric_history(run_id, key)) == 6, key  # one point per step (tiny: 6 steps)
    assert "eval/accuracy" in runs[0].data.metrics
    assert "rl_curves.png" in [a.path for a in client.list_artifacts(run_id)]
    # every step's rollouts, kept past the checkpoints the published stage drops
    logged = sorted(a.path for a in client.list_artifacts(run_id, "completions"))
    assert logged == [f"completions/completions_{step:05d}.parquet" for step in range(1, 7)]
    import pandas as pd

    step = pd.read_parquet(client.download_artifacts(run_id, logged[-1], str(tmp_path)))
    assert {"prompt", "completion", "accuracy_math", "format_think", "advantage"} <= set(step.columns)
    assert len(step) > 0 and step["advantage"].notna().all()


def test_dapo_with_dynamic_sampling_runs_on_two_deepspeed_ranks(tmp_path, monkeypatch):
    """Refill rounds are collective (every rank rolls out until all have enough groups) and the
    prioritized sampler must draw the same global batch on both ranks, or the ranks would hang.

    The ranks also start with a stale torch-extension lock, as a rank killed mid-start leaves it:
    DeepSpeed's CPU shm kernel waits on that lock forever, so the workers must not load it."""
    import mlflow
    from torch.utils.cpp_extension import _get_build_directory

    home = tmp_path / "home"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_extensions"))
    (Path(_get_build_directory("deepspeed_shm_comm", verbose=False)) / "lock").touch()
    # format_tags gives partial credit, so the random tiny model earns some reward in some groups:
    # ranks refill at different rates and the collective rounds are really exercised. The groups are
    # filtered by total reward here (DAPO's own default filters by accuracy, which a random model
    # never has, so no group would ever count as informative)
    rewards = ("[{name: accuracy_math, params: {answer_tags: true}}, {name: format_think, params: {answer_tags: true}}, "
               "{name: format_tags, params: {answer_tags: true}}]")
    proc = run_cli("run", "r1_zero", "--profile", "tiny", "--set", "stages.zero_rl.launcher={mode: deepspeed, ranks: 2}",
                   "--set", "stages.zero_rl.loss=dapo", "--set", "stages.zero_rl.sampler=prioritized",
                   "--set", "stages.zero_rl.dynamic_sampling_by=reward",
                   "--set", f"stages.zero_rl.rewards={rewards}", "--set", "eval=null",
                   "--set", "stages.zero_rl.max_steps=3", env_home=home, timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    run = client.search_runs(client.get_experiment_by_name("posttrain/r1_zero").experiment_id,
                             "tags.`posttrain.stage` = 'zero_rl'")[0]
    log = next((home / "stages" / "r1_zero").glob("zero_rl-*/worker.log")).read_text()
    assert "dist_world_size=2" in log
    history = {k: [m.value for m in client.get_metric_history(run.info.run_id, k)] for k in
               ("dynamic_sampling/rounds", "dynamic_sampling/informative_frac", "dynamic_sampling/cap_hit",
                "rewards/format_tags/mean")}
    assert max(history["rewards/format_tags/mean"]) > 0  # reward was earned...
    assert max(history["dynamic_sampling/informative_frac"]) > 0  # ...so informative groups were kept
    assert len(history["dynamic_sampling/rounds"]) == 3 and max(history["dynamic_sampling/rounds"]) > 1  # refills ran
    assert set(history["dynamic_sampling/cap_hit"]) <= {0.0, 1.0}


def test_prompt_templates():
    from toolkit.core.templates import BOXED_INSTRUCTION, check_template, render_prompt

    row = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]}
    assert render_prompt("chat", row) is row["prompt"]
    boxed = render_prompt("chat_boxed", row)
    assert boxed[-1]["content"] == "What is 2 + 2?\n" + BOXED_INSTRUCTION and boxed[0] == row["prompt"][0]
    assert row["prompt"][-1]["content"] == "What is 2 + 2?"  # the row itself is untouched
    text = render_prompt("r1_zero", row)
    assert text.startswith("A conversation between User and Assistant.") and text.endswith(
        "User: What is 2 + 2?. Assistant:")
    assert render_prompt("Q: {prompt}\nA:", row) == "Q: What is 2 + 2?\nA:"
    assert "unknown template" in check_template("plain")


def test_fillers_are_masked_out_of_the_token_divisor(tiny_model, tmp_path):
    def one_easy_group(completions, _index, **_):  # only prompt 4's group ever has variance
        return [float(len(str(c)) % 2) if i == 4 else 1.0 for c, i in zip(completions, _index)]
    trainer = _trainer(tiny_model, tmp_path, one_easy_group, max_rounds=3)
    batch = trainer._generate_and_score_completions([{}] * 4)
    assert trainer._metrics["train"]["dynamic_sampling/cap_hit"][-1] == 1.0
    informative = ~(batch["advantages"].view(2, 2) == 0).all(dim=1)
    mask = batch["completion_mask"].view(2, 2, -1)
    assert (mask[~informative].sum() == 0).item()  # filler groups carry no tokens into the loss
    assert batch["num_items_in_batch"].item() == mask[informative].sum().item()


def test_dynamic_sampling_by_accuracy_drops_groups_solved_all_or_nothing(tiny_model, tmp_path):
    def graded(completions, _index, **_):  # varied reward, but a success of 1 for every completion
        return [1.0 + (zlib.crc32(str(c).encode()) % 7) / 10 for c in completions]
    trainer = _trainer(tiny_model, tmp_path, graded, max_rounds=2)
    trainer.rl.dynamic_sampling_by = "accuracy"
    trainer._generate_and_score_completions([{}] * 4)
    assert trainer._metrics["train"]["dynamic_sampling/informative_frac"][-1] == 0.0
    assert trainer._metrics["train"]["dynamic_sampling/rounds"][-1] == 2.0


def test_vllm_importance_ratios_are_merged_by_dynamic_sampling():
    import torch

    from stages.grpo_trainer import concat_groups

    def part(width, is_shape):
        b = 2
        return {"prompt_ids": torch.ones(b, 3, dtype=torch.long), "prompt_mask": torch.ones(b, 3, dtype=torch.long),
                "completion_ids": torch.ones(b, width, dtype=torch.long),
                "completion_mask": torch.ones(b, width, dtype=torch.long), "advantages": torch.zeros(b),
                "importance_sampling_ratio": torch.full((b, width if is_shape == "token" else 1), 0.5)}
    per_token = concat_groups([part(4, "token"), part(6, "token")], pad_id=0)
    assert per_token["importance_sampling_ratio"].shape == (4, 6)
    assert per_token["importance_sampling_ratio"][0, 4:].tolist() == [1.0, 1.0]  # padding is neutral
    per_sequence = concat_groups([part(4, "sequence"), part(6, "sequence")], pad_id=0)
    assert per_sequence["importance_sampling_ratio"].shape == (4, 1)


def test_kimi_with_vllm_rollouts_is_refused():
    with pytest.raises(RecipeError, match=r"stages\[0\]\.loss: kimi_mirror_descent does not apply"):
        load_recipe("r1_zero", "tiny", ["stages.zero_rl.loss=kimi_mirror_descent", "stages.zero_rl.rollout=vllm_server"])


def test_curves_skip_steps_where_a_reward_judged_no_row():
    """A verifier-scoped accuracy is None on a batch of chat prompts; the curves skip those steps
    (this failed a qwen3 demo run's general_rl stage after training)."""
    from stages.rl_curves import curve_metrics, series

    history = [{"step": 1, "accuracy": 0.5, "reward": 1.0}, {"step": 2, "accuracy": None, "reward": 2.0},
               {"step": 3, "accuracy": 1.0, "reward": 3.0}, {"train_runtime": 9.0}]
    assert series(history, "accuracy") == ([1, 3], [0.5, 1.0])
    m = curve_metrics(history)
    assert m["train/accuracy_first_fifth"] == 0.5 and m["train/accuracy_last_fifth"] == 1.0
    assert m["train/reward_last_fifth"] == 3.0


def test_the_rl_curves_show_reward_components_kl_and_clipping(tmp_path):
    from PIL import Image

    from stages.rl_curves import curve_metrics, plot_curves

    history = [{"step": s, "reward": s / 4, "rewards/accuracy_math/mean": s / 8, "rewards/format_think/mean": 0.5,
                "accuracy": s / 8, "completions/mean_length": 40 + s, "kl": 0.01 * s, "clip_ratio/region_mean": 0.02}
               for s in range(1, 9)]
    m = curve_metrics(history)
    assert m["train/kl_last_fifth"] > m["train/kl_first_fifth"] and m["train/clip_fraction_last_fifth"] == 0.02
    assert plot_curves(history, tmp_path / "rl_curves.png")
    assert Image.open(tmp_path / "rl_curves.png").size[0] > 5 * 4.5 * 100  # five panels
