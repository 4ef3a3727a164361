"""The baseline for bench_grpo_overhead.py: the same GRPO run as a plain TRL script, the way one
would write it by hand. No Prefect, no MLflow, no checkpoints, no sampler, no evaluation."""

import argparse
import json
import time

if __name__ == "__main__":
    started = time.time()
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="JSON written by bench_grpo_overhead.py")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cfg = json.load(open(a.config))

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from data_curation.sources import load_rows
    from toolkit.rewards import get_reward

    rows = load_rows("synthetic_math", "train", cfg["rows"], 0, {"difficulties": [1]})
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(cfg["model"])
    args = GRPOConfig(output_dir=a.out, max_steps=cfg["steps"], learning_rate=cfg["lr"], lr_scheduler_type="constant",
                      per_device_train_batch_size=cfg["batch"], num_generations=cfg["G"],
                      max_completion_length=cfg["max_completion_length"], beta=cfg["beta"], loss_type="grpo",
                      temperature=1.0, seed=42, logging_steps=1, save_strategy="no", report_to=[],
                      use_cpu=not torch.cuda.is_available(), use_bias_correction_kl=False,
                      # TRL's defaults are bf16 and gradient checkpointing on; the stage's are off
                      bf16=False, gradient_checkpointing=False)
    rewards = [get_reward("accuracy_math"), get_reward("format_think")]
    trainer = GRPOTrainer(model=cfg["model"], args=args, train_dataset=data, reward_funcs=rewards,
                          processing_class=tokenizer)
    trainer.train()
    trainer.save_model(a.out + "/model")
    print(json.dumps({"seconds": time.time() - started}))
