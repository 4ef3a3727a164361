import json
import os
import subprocess
import sys
from pathlib import Path

from stages.contracts import WorkerSpec
from stages.runtime import StageContext, checkpoint_step, last_checkpoint


def test_resume_skips_and_removes_checkpoints_cut_short_mid_save(tmp_path):
    ckpts = tmp_path / "checkpoints"
    # 15: killed before trainer_state.json; 20: killed while writing it (HF does not write it atomically;
    # the suite's resume test met an empty one, before the checkpoint's manifest existed)
    for step, state in [(5, "{}"), (10, "{}"), (15, None), (20, ""), (25, '{"global_step": 2')]:
        d = ckpts / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x")
        if state is not None:
            (d / "trainer_state.json").write_text(state)
    ctx = StageContext.local(tmp_path)
    chosen = last_checkpoint(ctx)
    assert Path(chosen).name == "checkpoint-10" and checkpoint_step(chosen) == 10
    assert not any((ckpts / f"checkpoint-{step}").exists() for step in (15, 20, 25))


def test_no_checkpoints_means_fresh_start(tmp_path):
    assert last_checkpoint(StageContext.local(tmp_path)) is None


def test_a_data_stage_worker_imports_neither_torch_nor_mlflow(tmp_path):
    """A stage that trains nothing starts in well under a second: no trainer callback (transformers,
    peft), no torch.distributed, no MLflow (the flow logs its output). The run id is one MLflow has
    never seen, so a worker that still logged would fail here."""
    from data_curation.report import write_jsonl
    from data_curation.sources import load_rows

    rows = tmp_path / "rows.jsonl"
    write_jsonl(rows, load_rows("synthetic_math", n=40))
    out = tmp_path / "out"
    stage = {"name": "decontam", "kind": "decontaminate", "data": {"source": "upstream.dataset"},
             "eval_sets": [{"source": "synthetic_math", "split": "eval", "n": 50}]}
    spec = WorkerSpec(kind="decontaminate", stage=stage, inputs={"data": {"n": None, "path": str(rows)}}, eval=None,
                      output_dir=str(out), mlflow_run_id="0" * 32)
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    code = ("import sys; from pipeline.worker import main; main([sys.argv[1]]); "
            "print(sorted(m for m in ('torch', 'mlflow', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "spec.json")], capture_output=True, text=True,
                          env={**os.environ, "POSTTRAIN_HOME": str(tmp_path / "home"),
                               "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert json.loads((out / "result.json").read_text())["metrics"]["curate/rows_in"] == 40


def test_padding_free_sft_trains_as_the_padded_batch_does(tmp_path, tiny_model, monkeypatch):
    """The same rows, seed and steps three times: padding-free with attention row by row (chosen, since
    both checks pass for Qwen3), padded (the check made to fail), and padding-free with TRL's own fused
    LM head instead of the dense one (stages.dense_logps.answer_fused_head_densely). The rows differ in
    length, so the padded batches hold padding; the weights after three steps are the same."""
    from safetensors.torch import load_file

    import stages.dense_logps
    import stages.padding_free
    from data_curation.sources import load_rows
    from stages import sft
    from stages.padding_free import PER_ROW_ATTENTION

    rows = load_rows("synthetic_math", "train", 6, 1) + load_rows("general_chat", "train", 6, 1)
    weights, flags = {}, {}
    for mode in ("padding_free", "trl_head", "padded"):
        if mode == "trl_head":
            monkeypatch.setattr(stages.dense_logps, "answer_fused_head_densely", lambda model: False)
        if mode == "padded":
            monkeypatch.undo()
            monkeypatch.setattr(stages.padding_free, "packing_mismatch", lambda *a, **k: "made to fail by the test")
        cfg = sft.SFTConfig(name=mode, model=str(tiny_model), data="synthetic_math", max_steps=3, per_device_batch_size=4,
                            learning_rate=1e-3, max_length=96, save_steps=1000)
        (tmp_path / mode).mkdir()
        metrics = sft.train_on_rows(cfg, StageContext.local(tmp_path / mode), str(tiny_model), rows)
        flags[mode] = (metrics["train/padding_free"], metrics["train/per_row_attention"], metrics["train/dense_lm_head"])
        weights[mode] = load_file(tmp_path / mode / "model" / "model.safetensors")
        saved = json.loads((tmp_path / mode / "model" / "config.json").read_text())
        assert PER_ROW_ATTENTION not in json.dumps(saved)  # the saved model loads anywhere, with its own attention
    assert flags == {"padding_free": (1.0, 1.0, 1.0), "trl_head": (1.0, 1.0, 0.0), "padded": (0.0, 0.0, 1.0)}
    start = load_file(tiny_model / "model.safetensors")
    moved = max((weights["padded"][k] - start[k]).abs().max().item() for k in start)
    for other in ("padding_free", "trl_head"):
        differ = max((weights[other][k] - weights["padded"][k]).abs().max().item() for k in start)
        # measured: moved 2.0e-3, differ 1.5e-6 (float rounding, which Adam scales up); rows that attend
        # to each other's tokens (packing detection switched off) differ by 4.0e-3
        assert moved > 1e-3 and differ < 1e-2 * moved, (other, moved, differ)


def test_the_dense_head_answers_trl_s_fused_head_calls_with_its_numbers(tiny_model):
    """What TRL's SFT trainer reads from `model(..., labels, fused_lm_head=True)`: log p, entropy and
    top-1 of each next label, the label mask and the loss, from TRL's head and from the dense one
    (stages.dense_logps.answer_fused_head_densely), on a padded batch and with a token count given."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from stages.dense_logps import answer_fused_head_densely

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 200, (2, 5), generator=g)
    with torch.no_grad():  # 3 greedy tokens (each the likeliest), then 4 drawn at random (mostly not)
        greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, min_new_tokens=3,
                                do_sample=False)
    ids = torch.cat([greedy, torch.randint(5, 200, (2, 4), generator=g)], 1)
    labels = ids.clone()
    labels[:, :5], labels[1, 10:] = -100, -100  # a prompt; a shorter second row, padded
    mask = ((labels != -100) | (torch.arange(12) < 5)).long()
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))

    def scored(count):
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True, num_items_in_batch=count)
        return [out.loss, out.log_probs, out.entropy, out.is_top1.float(), out.label_mask.float()]

    counts = (None, torch.tensor(7))
    trl = [scored(count) for count in counts]
    assert answer_fused_head_densely(model)
    dense = [scored(count) for count in counts]
    for ours, theirs in zip(dense, trl):
        for name, a, b in zip(("loss", "log_probs", "entropy", "is_top1", "label_mask"), ours, theirs):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name
    top1, real = dense[0][3], dense[0][4]
    assert 0 < top1.sum() < real.sum()  # the greedy labels, not the random ones
    assert model(input_ids=ids).logits.shape == (2, 12, model.config.vocab_size)  # other calls as before


def test_a_reward_model_trains_on_flat_pairs_as_on_padded_ones(tmp_path, tiny_model, monkeypatch):
    """The reward-model stage twice on the same pairs, seed and steps: flat batches (every response end
    to end, attention row by row, each reward read where the padded batch pools it) and TRL's padded
    ones (the choice made to fail). The padded thinking makes the two sides of a pair differ in
    length, so the padded batches hold padding; the weights after three steps are the same."""
    from safetensors.torch import load_file

    import stages.reward_model
    from data_curation.report import write_jsonl
    from data_curation.sources import load_rows
    from stages.padding_free import PER_ROW_ATTENTION
    from stages.preference_pairs import padded_pairs
    from stages.reward_model import RewardModelConfig

    write_jsonl(tmp_path / "pairs.jsonl", padded_pairs(load_rows("synthetic_math", "train", 48, 4), padding=2))
    weights, flags = {}, {}
    for mode in ("flat", "padded"):
        if mode == "padded":
            monkeypatch.setattr(stages.reward_model, "reward_padding_free", lambda *a, **k: (False, {}))
        cfg = RewardModelConfig(name=mode, model=str(tiny_model), pairs="pairs", max_steps=3, per_device_batch_size=4,
                                learning_rate=1e-3, max_length=256, save_steps=1000)
        inputs = {"model": str(tiny_model), "pairs": {"path": str(tmp_path / "pairs.jsonl")}}
        metrics = stages.reward_model.run(cfg, StageContext.local(tmp_path / mode, inputs, "reward_model")).metrics
        flags[mode] = (metrics["train/padding_free"], metrics["train/per_row_attention"])
        weights[mode] = load_file(tmp_path / mode / "model" / "model.safetensors")
        assert PER_ROW_ATTENTION not in (tmp_path / mode / "model" / "config.json").read_text()  # loads anywhere
    assert flags == {"flat": (1.0, 1.0), "padded": (0.0, 0.0)}
    first = {k: v for k, v in load_file(tiny_model / "model.safetensors").items() if k in weights["padded"]}

    def norm(delta):  # the L2 norm over every weight the two models share with the start
        return sum(delta(k).norm().item() ** 2 for k in first) ** 0.5

    moved = norm(lambda k: weights["padded"][k] - first[k])
    differ = norm(lambda k: weights["flat"][k] - weights["padded"][k])
    # measured: differ/moved 3.3e-5 (float rounding, which Adam scales up; the largest single weight
    # 1.6e-5 against moves of 2.0e-3); rewards read one token early: 1.3
    assert differ < 1e-2 * moved, (moved, differ)


def test_the_packing_check_refuses_an_attention_that_reads_flattened_rows_as_one(tiny_model, monkeypatch):
    """With transformers' packed-sequence detection switched off, the flattened rows attend to each
    other: the check sees the logits move and keeps the padded batch."""
    import transformers.masking_utils

    from stages.padding_free import packing_mismatch, padding_free_collator, reward_packing_mismatch

    assert packing_mismatch(str(tiny_model)) is None and reward_packing_mismatch(str(tiny_model)) is None
    monkeypatch.setattr(transformers.masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    assert "does not keep rows apart" in packing_mismatch(str(tiny_model))
    assert "does not keep rows apart" in reward_packing_mismatch(str(tiny_model))
    logged = []
    assert padding_free_collator(str(tiny_model), False, log=logged.append) == (None, {})
    assert logged[0].startswith("sft: padded batches (flattened rows change the logits")


def test_the_reward_packing_check_catches_rewards_read_off_the_last_token(tiny_model, monkeypatch):
    """Flat rewards read one token early (each response's reward from its second-to-last token) are
    caught, and reward-model training keeps TRL's padded batches."""
    import stages.padding_free
    from stages.padding_free import reward_packing_mismatch, reward_padding_free

    real = stages.padding_free.collate_flat_preferences

    def one_early(examples, pad_token_id):
        batch = real(examples, pad_token_id)
        return {**batch, "pool_index": batch["pool_index"] - 1}

    monkeypatch.setattr(stages.padding_free, "collate_flat_preferences", one_early)
    assert "change the logits" in reward_packing_mismatch(str(tiny_model))
    logged = []
    assert reward_padding_free(str(tiny_model), False, log=logged.append) == (False, {})
    assert logged[0].startswith("reward_model: padded batches (flattened rows change the logits")


def test_attention_row_by_row_is_used_only_where_its_check_passes(tiny_model, monkeypatch):
    """Per-row attention that lets the flattened rows attend to each other (one causal pass over all of
    them) is caught by the check, and training falls back to the block-causal mask; the real one passes."""
    import torch

    import stages.padding_free
    from stages.padding_free import PER_ROW_ATTENTION, padding_free_collator

    logged = []
    collator, attention = padding_free_collator(str(tiny_model), False, log=logged.append)
    assert collator is not None and attention == {"attn_implementation": PER_ROW_ATTENTION}
    assert "attention row by row" in logged[0]

    def one_sequence(module, query, key, value, attention_mask, position_ids=None, **kwargs):
        out = torch.nn.functional.scaled_dot_product_attention(query, key.repeat_interleave(module.num_key_value_groups, 1),
                                                               value.repeat_interleave(module.num_key_value_groups, 1),
                                                               is_causal=True, scale=kwargs.get("scaling"))
        return out.transpose(1, 2).contiguous(), None

    monkeypatch.setattr(stages.padding_free, "per_row_sdpa", one_sequence)
    logged.clear()
    collator, attention = padding_free_collator(str(tiny_model), False, log=logged.append)
    assert collator is not None and attention == {}
    assert "not row by row (flattened rows change the logits" in logged[0]


def test_a_no_loss_prefix_is_masked_out_of_the_sft_loss(tmp_path, tiny_model):
    """A fusion row with a cut thought (data_curation/fusion.py) trains on its answer only: TRL's
    tokenized row has no loss on the cut thought and the stop-thinking string,
    which a budget inserts at inference and the model must not learn to write; other rows are as
    TRL made them. A prefix the completion does not start with is refused, in train_on_rows too."""
    import pytest
    from datasets import Dataset
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    from data_curation.fusion import NO_LOSS_PREFIX
    from stages import sft
    from toolkit.core.thinking import EMPTY_THINK, STOP_THINKING
    from toolkit.rollouts import load_tokenizer
    from toolkit.rollouts.sampling import render

    prefix = "<think>\nFirst add 2 and" + STOP_THINKING
    ask = [{"role": "user", "content": "What is 2 + 3?"}]
    direct = EMPTY_THINK + "The answer is \\boxed{5}."
    rows = [{"id": "cut", "prompt": ask, "solution": prefix + "The answer is \\boxed{5}.", NO_LOSS_PREFIX: prefix},
            {"id": "whole", "prompt": ask, "solution": "<think>\n2 + 3 = 5.\n</think>\n\nThe answer is \\boxed{5}."},
            # a hard-switch row and its /no_think twin: the same completion, the block untrained in one only
            {"id": "switch", "prompt": ask, "solution": direct, NO_LOSS_PREFIX: EMPTY_THINK},
            {"id": "flagged", "prompt": [{"role": "user", "content": "What is 2 + 3? /no_think"}], "solution": direct}]
    tokenizer = load_tokenizer(str(tiny_model))
    trainer = SFTTrainer(model=str(tiny_model), processing_class=tokenizer,
                         train_dataset=Dataset.from_list(sft.to_prompt_completion(rows)),
                         args=TRLSFTConfig(output_dir=str(tmp_path / "trl"), completion_only_loss=True, report_to=[],
                                           bf16=False, use_cpu=True))
    before = trainer.train_dataset
    after = sft.without_prefix_loss(before, rows, tokenizer)
    trained = lambda row: tokenizer.decode([t for t in row["labels"] if t != -100])
    assert trained(before[0]).startswith("<think>") and "Considering" in trained(before[0])
    assert "\\boxed{5}" in trained(after[0]) and "Considering" not in trained(after[0]) and "add 2" not in trained(after[0])
    assert after[1] == before[1] and after[3] == before[3]
    assert trained(after[2]).startswith("The answer is") and trained(before[2]).startswith("<think>")
    # trained as inference lays out the hard switch: the prompt rendered with enable_thinking=False
    assert tokenizer.decode(after[2]["input_ids"]).startswith(render(tokenizer, ask, enable_thinking=False))
    prompt_tokens = after[0]["labels"].count(-100) - len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    short = SFTTrainer(model=str(tiny_model), processing_class=tokenizer,  # cut 3 tokens into the prefix
                       train_dataset=Dataset.from_list(sft.to_prompt_completion(rows)),
                       args=TRLSFTConfig(output_dir=str(tmp_path / "trl"), completion_only_loss=True, report_to=[],
                                         bf16=False, use_cpu=True, max_length=prompt_tokens + 3)).train_dataset
    key = lambda row: (row["prompt"][0]["content"], row["completion"][0]["content"][:12])
    assert len(short) == 3  # TRL dropped the flagged row: its longer prompt filled max_length
    # the cut and the switch rows have nothing left to train past their prefixes; the whole row keeps its tokens
    assert [key(r) for r in sft.without_prefix_loss(short, rows, tokenizer)] == [key(short[1])]
    wrong = [{**rows[0], NO_LOSS_PREFIX: "<think>\nSomething else" + STOP_THINKING}, *rows[1:]]
    with pytest.raises(ValueError, match="does not start with its no_loss_prefix"):
        sft.without_prefix_loss(before, wrong, tokenizer)
    cfg = sft.SFTConfig(name="wired", model=str(tiny_model), data="synthetic_math", max_steps=1, save_steps=1000)
    (tmp_path / "wired").mkdir()
    with pytest.raises(ValueError, match="row cut: its tokenized completion"):
        sft.train_on_rows(cfg, StageContext.local(tmp_path / "wired"), str(tiny_model), wrong)


def test_every_trl_config_takes_the_stage_s_precision_and_checkpointing_not_trl_s_defaults(tmp_path):
    """TRL's configs default to bfloat16 autocast and gradient checkpointing (`bf16=None` becomes
    True, `gradient_checkpointing=True`): a trainer built without the stage's own values would train in
    mixed precision and, in GKD, sample without a KV cache (15 s a demo step against 7). Every TRL
    config the stages build starts from `trainer_args`, which must carry both."""
    from trl import DPOConfig, GRPOConfig, RewardConfig, SFTConfig
    from trl.experimental.gkd import GKDConfig

    from stages.distill import DistillConfig
    from stages.runtime import trainer_args

    cfg = DistillConfig(name="s", student="student", teacher="teacher", data={"source": "synthetic_math", "n": 4})
    assert not cfg.bf16 and not cfg.gradient_checkpointing
    args = trainer_args(cfg, StageContext.local(tmp_path))
    trl_default = SFTConfig(output_dir=str(tmp_path), use_cpu=True)
    assert trl_default.bf16 and trl_default.gradient_checkpointing  # what leaks in without trainer_args
    for config in (SFTConfig, GRPOConfig, DPOConfig, RewardConfig, GKDConfig):
        built = config(**args, **({"num_generations": 2} if config is GRPOConfig else {}))
        assert built.bf16 is False and built.gradient_checkpointing is False, config.__name__
