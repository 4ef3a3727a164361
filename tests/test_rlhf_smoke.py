"""`rlhf_smoke` on `tiny` through the real flow (the reward model under DeepSpeed with 2 ranks), and
long2short DPO on a tiny model trained to think verbosely."""

import json
from pathlib import Path

import mlflow
import pytest

from stages.runtime import StageContext
from tests.conftest import padded_pairs_file, run_named_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rlhf_run(prefect_harness, tiny_model):
    return {s["name"]: s for s in run_named_recipe("rlhf_smoke")["stages"]}


def _artifacts(stage) -> set[str]:
    return {a.path for a in mlflow.MlflowClient().list_artifacts(stage["mlflow_run_id"])}


def test_reward_model_learns_the_preference_under_deepspeed(rlhf_run):
    rm = rlhf_run["rm"]
    assert rm["metrics"]["rm/pairwise_accuracy"] > 0.8 and rm["metrics"]["rm/eval_pairs"] >= 20
    assert rm["metrics"]["rm/pairwise_accuracy_lo"] > 0.5  # its interval excludes chance
    assert "eval/accuracy" not in rm["metrics"]  # a classifier is not evaluated as a policy
    assert "rm_margins.png" in _artifacts(rm)
    log = (Path(rm["output_dir"]) / "worker.log").read_text()
    assert "--num_gpus 2" in log and "dist_world_size=2" in log and "does not exclude chance" not in log
    # flat preference batches, attention row by row, under DeepSpeed too (the reward head read by a hook)
    assert (rm["metrics"]["train/padding_free"], rm["metrics"]["train/per_row_attention"]) == (1.0, 1.0)


def test_dpo_logs_its_preference_metrics(rlhf_run):
    m = rlhf_run["dpo"]["metrics"]
    assert m["dpo/reward_accuracies"] > 0.5 and m["dpo/reward_margins"] > 0
    assert {"dpo/response_tokens_before", "dpo/response_tokens_after", "eval/accuracy"} <= set(m)


def test_model_scored_grpo_uses_the_trained_reward_model(rlhf_run):
    rl = rlhf_run["rl"]
    assert rl["metrics"]["train/rewards/reward_model_full/scored"] > 0
    history = mlflow.MlflowClient().get_metric_history(rl["mlflow_run_id"], "rewards/reward_model_full/mean")
    assert len(history) >= 3  # scored every step
    config = json.loads((Path(rl["output_dir"]) / "stage_config.json").read_text())
    assert config["inputs"]["rewards.0.params.model"] == str(Path(rlhf_run["rm"]["output_dir"]) / "model")


def test_merge_averages_the_two_models(rlhf_run):
    import torch
    from safetensors.torch import load_file

    weights = [load_file(str(Path(rlhf_run[s]["output_dir"]) / "model" / "model.safetensors"))
               for s in ("cold_start", "dpo", "merged")]
    key = next(k for k in weights[0] if k.endswith("q_proj.weight"))
    assert torch.allclose(weights[2][key], 0.5 * weights[0][key] + 0.5 * weights[1][key], atol=1e-6)


def test_distillation_compares_student_before_after_and_teacher(rlhf_run):
    for name in ("distill_off", "distill_on"):
        m = rlhf_run[name]["metrics"]
        assert {"before/eval/accuracy", "teacher/eval/accuracy", "eval/accuracy"} <= set(m)
        assert m["distill/kl_after"] < m["distill/kl_before"], (name, m["distill/kl_before"], m["distill/kl_after"])
    assert rlhf_run["distill_off"]["metrics"]["distill/traces_kept"] > 0


def test_distillation_refuses_a_student_with_another_tokenizer(tmp_path, tiny_model):
    from pipeline.models.named import ensure_named_model
    from stages.distill import check_same_tokenizer

    other = tmp_path / "other"
    tok = __import__("transformers").AutoTokenizer.from_pretrained(str(tiny_model))
    tok.add_tokens(["<extra_token>"])
    tok.save_pretrained(other)
    student = str(ensure_named_model("tiny-qwen3-student"))
    check_same_tokenizer("tiny-qwen3-student", "tiny-qwen3", student, str(tiny_model))  # same: fine
    with pytest.raises(ValueError, match="student tiny-qwen3-student and teacher mine have different tokenizers"):
        check_same_tokenizer("tiny-qwen3-student", "mine", student, str(other))


def test_on_policy_distillation_loss_is_trls_with_the_lm_heads_on_labelled_positions_only(tiny_model):
    """stages.distill.lean_gkd_trainer runs both LM heads and the divergence from the first labelled
    column on: the loss and the student's gradients are TRL's (rows whose prompts are left-padded to
    different widths, a completion cut short by its end token), for every beta."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM
    from trl.experimental.gkd import GKDTrainer

    from pipeline.models.named import ensure_named_model
    from stages.distill import lean_gkd_trainer

    torch.manual_seed(0)
    student = AutoModelForCausalLM.from_pretrained(str(ensure_named_model("tiny-qwen3-student")))
    teacher = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    ids = torch.randint(5, 200, (3, 20))
    mask = torch.ones_like(ids)
    mask[0, :4], mask[1, :2] = 0, 0  # the prompts are 8 columns wide, left-padded
    labels = ids.clone()
    labels[:, :8] = -100
    labels[2, 15:] = -100  # ended early
    labels[1, 8:11] = -100  # labels start later in one row than the batch's first labelled column
    inputs = {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def loss_and_grads(compute_loss, beta):
        student.zero_grad()
        me = SimpleNamespace(teacher_model=teacher, beta=beta, generalized_jsd_loss=GKDTrainer.generalized_jsd_loss)
        loss = compute_loss(me, student, inputs)
        loss.backward()
        return loss.item(), [p.grad.clone() for p in student.parameters()]

    for beta in (0.0, 0.5, 1.0):
        trl_loss, trl_grads = loss_and_grads(GKDTrainer.compute_loss, beta)
        lean_loss, lean_grads = loss_and_grads(lean_gkd_trainer().compute_loss, beta)
        assert lean_loss == pytest.approx(trl_loss, rel=1e-5) and trl_loss > 0
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(lean_grads, trl_grads))


def test_long2short_dpo_shortens_a_verbose_model(tmp_path, tiny_model):
    """The issue's evidence: a tiny model fine-tuned to think verbosely, then DPO on concise-vs-padded
    pairs: its greedy responses get shorter, and accuracy stays within 0.1 of where it was."""
    from data_curation.sources import load_rows
    from stages import dpo, sft
    from stages.evaluate import EvalSpec, evaluate
    from stages.preference_pairs import padded_pairs

    rows = load_rows("synthetic_math", "train", 400, 3, {"difficulties": [1]})
    pairs = padded_pairs(rows, padding=2)
    pairs_file = tmp_path / "pairs.jsonl"
    pairs_file.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    verbose = [{**r, "solution": p["rejected"]} for r, p in zip(rows, pairs)]
    (tmp_path / "verbose").mkdir()
    cfg = sft.SFTConfig(name="verbose", model=str(tiny_model), data="synthetic_math", max_steps=80,
                        per_device_batch_size=16, learning_rate=3e-3, max_length=320, save_steps=1000)
    sft.train_on_rows(cfg, StageContext.local(tmp_path / "verbose"), str(tiny_model), verbose)
    verbose_model = str(tmp_path / "verbose" / "model")
    (tmp_path / "dpo").mkdir()
    d = dpo.DPOConfig(name="short", model=verbose_model, pairs={"path": str(pairs_file)}, max_steps=20,
                      per_device_batch_size=8, learning_rate=1e-4, max_length=320, save_steps=1000,
                      length_probe=12, length_probe_tokens=200)
    out = dpo.run(d, StageContext.local(tmp_path / "dpo", {"model": verbose_model, "pairs": {"path": str(pairs_file)}}))
    before, after = out.metrics["dpo/response_tokens_before"], out.metrics["dpo/response_tokens_after"]
    assert after < 0.8 * before, (before, after)
    spec = EvalSpec(data={"source": "synthetic_math", "split": "eval", "n": 24, "params": {"difficulties": [1]}},
                    max_new_tokens=200)
    eval_rows = load_rows("synthetic_math", "eval", 24, 0, {"difficulties": [1]})
    acc_before = evaluate(verbose_model, spec, eval_rows)[0]["eval/accuracy"]
    acc_after = evaluate(str(tmp_path / "dpo" / "model"), spec, eval_rows)[0]["eval/accuracy"]
    assert acc_after >= acc_before - 0.1, (acc_before, acc_after)


def test_dpo_sft_weight_keeps_the_chosen_answers_likely(tmp_path, tiny_model):
    """RPO's NLL term: the same pairs, steps and seed with and without it; with it the chosen
    responses end more likely (plain DPO may lower both sides while it widens the margin)."""
    from stages import dpo

    pairs_file = padded_pairs_file(tmp_path / "pairs.jsonl", 32, 3)
    chosen_logps = {}
    for weight in (0.0, 1.0):
        out_dir = tmp_path / f"sft_weight_{weight}"
        out_dir.mkdir()
        inputs = {"model": str(tiny_model), "pairs": {"path": pairs_file}}
        cfg = dpo.DPOConfig(name="d", max_steps=6, per_device_batch_size=8, learning_rate=1e-3, max_length=256,
                            save_steps=1000, length_probe=0, sft_weight=weight, **inputs)
        chosen_logps[weight] = dpo.run(cfg, StageContext.local(out_dir, inputs)).metrics["dpo/logps_chosen"]
    assert chosen_logps[1.0] > chosen_logps[0.0], chosen_logps
