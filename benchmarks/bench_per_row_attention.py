"""Attention row by row against attention over the block-causal mask, on padding-free SFT batches:
the same model, the same batches, forward and backward with each implementation in turn, step by
step (so that a machine whose speed drifts over minutes, as these do, gives both the same drift).
No optimizer step: the weights stay put, so both implementations compute the same gradients, and
the largest difference between them is printed beside the times (issue: fast generation).

Batches: TRL's padding-free collator over the rows of a `synthetic_math` cold start (levels 1-3,
SmolLM2's chat template, cut at 192 tokens as the stage cuts them), `--batch` rows each. The loss
here covers every position, where the stage's covers the completion only (TRL's fused LM head skips
the prompt): the attention is the same, the LM head's share of a step larger here.

    .venv/bin/python benchmarks/bench_per_row_attention.py [--model smollm2-135m-instruct] [--batch 8] [--steps 16]
"""

from __future__ import annotations

import argparse
import statistics
import time

from recipe_runs import positive_int


def batches(model_dir: str, n_batches: int, batch: int) -> list[dict]:
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from data_curation.sources import load_rows
    from toolkit.rollouts import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    rows = load_rows("synthetic_math", "train", n_batches * batch, 0, {"difficulties": [1, 2, 3]})
    ids = [tokenizer.apply_chat_template(r["prompt"] + [{"role": "assistant", "content": r["solution"]}],
                                         tokenize=True)["input_ids"][:192] for r in rows]
    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    return [collate([{"input_ids": x} for x in ids[i:i + batch]]) for i in range(0, len(ids), batch)]


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.models.named import resolve_model
    from pipeline.store.home import configure_environment
    from stages.padding_free import PER_ROW_ATTENTION, register_per_row_attention

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=positive_int, default=8)
    parser.add_argument("--steps", type=positive_int, default=16, help="batches, each run by both implementations")
    args = parser.parse_args()
    configure_environment()
    model_dir = resolve_model(args.model)
    register_per_row_attention()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    arms = {"mask": model.config._attn_implementation, "per row": PER_ROW_ATTENTION}
    print(f"{args.steps} padding-free batches of {args.batch} rows; torch threads {torch.get_num_threads()}; "
          f"the mask arm is transformers' {arms['mask']!r}", flush=True)
    seconds: dict[str, list[float]] = {arm: [] for arm in arms}
    worst = 0.0
    data = batches(model_dir, args.steps, args.batch)
    for step, batch in enumerate([data[0], *data]):  # step 0, untimed: the kernels' warm-up
        grads = {}
        for arm in (arms if step % 2 else reversed(list(arms))):  # alternate which goes first
            model.set_attn_implementation(arms[arm])
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            model(**batch, use_cache=False).loss.backward()
            took = time.perf_counter() - start
            grads[arm] = torch.cat([p.grad.flatten() for p in model.parameters()])
            if step:
                seconds[arm].append(took)
        scale = grads["mask"].abs().max().item()
        worst = max(worst, (grads["per row"] - grads["mask"]).abs().max().item() / scale)
    print("| attention | median s per step | total s | vs mask |")
    print("| --- | --- | --- | --- |")
    for arm, times in seconds.items():
        print(f"| {arm} | {statistics.median(times):.3f} | {sum(times):.1f} | {sum(times) / sum(seconds['mask']):.2f}x |")
    print(f"largest gradient difference, relative to the largest gradient: {worst:.2e}")


if __name__ == "__main__":
    main()
