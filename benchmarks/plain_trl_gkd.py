"""The baseline for bench_gkd_overhead.py: the same on-policy distillation as a plain TRL GKD script,
the way one would write it by hand. No Prefect, no MLflow, no checkpoints, no evaluation."""

import argparse
import json
import time

if __name__ == "__main__":
    started = time.time()
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="JSON written by bench_gkd_overhead.py")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cfg = json.load(open(a.config))

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from data_curation.sources import load_rows

    rows = load_rows("synthetic_math", "train", cfg["rows"], 0, {"difficulties": [1]})
    data = Dataset.from_list([{"messages": [*r["prompt"], {"role": "assistant", "content": ""}]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(cfg["student"])
    args = GKDConfig(output_dir=a.out, max_steps=cfg["steps"], learning_rate=cfg["lr"], lr_scheduler_type="constant",
                     per_device_train_batch_size=cfg["batch"], max_length=cfg["max_length"], lmbda=1.0,
                     beta=cfg["beta"], temperature=cfg["temperature"], max_new_tokens=cfg["max_new_tokens"],
                     seed=42, logging_steps=1, save_strategy="no", report_to=[], use_cpu=not torch.cuda.is_available(),
                     bf16=False, gradient_checkpointing=False, teacher_model_init_kwargs={"dtype": None})
    trainer = GKDTrainer(model=cfg["student"], teacher_model=cfg["teacher"], args=args, train_dataset=data,
                         processing_class=tokenizer)
    trainer.train()
    trainer.save_model(a.out + "/model")
    print(json.dumps({"seconds": time.time() - started}))
