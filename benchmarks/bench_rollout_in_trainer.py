"""Why GRPO's rollouts run slower than a plain `generate` of the same model (issue: fast generation).

In `posttrain run r1 --profile demo` the grpo stage's rollouts took 0.3-0.5 s per decode step at
16 completions, against 0.14-0.18 s for HF `generate` at batch 16 in bench_generation.py. This
script times one batch of 16 sampled completions of exactly N tokens from the same model in the
states a trainer leaves it in, one change at a time, in one process:

- eval:        model.eval(), torch.no_grad() (bench_generation.py's setting; the baseline)
- train:       model.train() (TRL generates without switching to eval)
- trl config:  train mode with TRL's GenerationConfig (its sampling keys, cache_implementation None)
- after step:  the same after one forward/backward and AdamW step (allocator and optimizer state)

    .venv/bin/python benchmarks/bench_rollout_in_trainer.py MODEL_DIR [--tokens 96] [--repeats 2]

Prints ms per decode step for each and the ratio to `eval`.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def prompts(tokenizer, n: int) -> list[str]:
    from data_curation.sources.synthetic_math import rows

    def messages(prompt):  # rows carry a string or chat messages
        return prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]

    return [tokenizer.apply_chat_template(messages(r["prompt"]), tokenize=False, add_generation_prompt=True)
            for r in rows("train", n, seed=99, difficulties=[1, 2, 3])]


def time_generate(model, batch, config, tokens: int, repeats: int) -> float:
    """Best of `repeats`, in ms per decode step."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        with torch.no_grad():
            model.generate(**batch, generation_config=config)
        best = min(best, (time.perf_counter() - started) / tokens * 1000)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    batch = tokenizer(prompts(tokenizer, args.batch), return_tensors="pt", padding=True)
    fixed = {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens, "do_sample": True,
             "temperature": 1.0, "top_p": 1.0, "pad_token_id": tokenizer.pad_token_id}
    plain = GenerationConfig(**fixed)
    trl_like = GenerationConfig(**fixed, bos_token_id=tokenizer.bos_token_id, eos_token_id=[tokenizer.eos_token_id],
                                top_k=0, min_p=None, repetition_penalty=1.0, cache_implementation=None,
                                disable_compile=True)
    print(f"torch threads {torch.get_num_threads()}, batch {args.batch}, {args.tokens} tokens, "
          f"prompt width {batch['input_ids'].shape[1]}", flush=True)
    results = {}
    model.eval()
    results["eval"] = time_generate(model, batch, plain, args.tokens, args.repeats)
    model.train()
    results["train"] = time_generate(model, batch, plain, args.tokens, args.repeats)
    results["trl config"] = time_generate(model, batch, trl_like, args.tokens, args.repeats)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    out = model(**batch, labels=batch["input_ids"])
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    results["after step"] = time_generate(model, batch, trl_like, args.tokens, args.repeats)
    print("| state | ms per decode step | x eval |\n| --- | --- | --- |")
    for name, ms in results.items():
        print(f"| {name} | {ms:.0f} | {ms / results['eval']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
