"""ONNX Runtime GenAI's decode step when sampling, by how the token is drawn (issue: fast generation).

GRPO's rollouts, the difficulty and no-CoT filters and rejection sampling sample the whole
distribution (temperature 1, top_p 1). ORT GenAI's own sampler does that when told `top_k=0`, and
its config's default is to keep only the 50 likeliest tokens. `ort_sampler` now draws such tokens
itself (`toolkit.rollouts.ort.forced_draw`: `torch.multinomial` over the softmax of the logits ORT
computed, handed back to ORT's greedy search through `set_logits`). One run, one model, one batch of
copies of one prompt, each variant `--repeats` times (the best kept):

- greedy: ORT's own argmax, the floor a sampled step can reach;
- ORT's sampler with its top-50 default (a cut distribution: what ran before 2026-12-04);
- ORT's sampler over the whole distribution (`top_k=0`, `top_p=1`);
- the draw in torch through `set_logits` (the whole distribution; what `ort_sampler` runs).

Printed: milliseconds per decode step (the batch's forward and the draw), and the ratio to greedy.

    .venv/bin/python benchmarks/bench_ort_sampling.py [--model smollm2-135m-instruct] [--rows 16] [--tokens 128]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from data_curation.sources import load_rows
from pipeline.models.named import resolve_model
from pipeline.store.home import configure_environment
from toolkit.rollouts.ort import converted, forced_draw, open_model


def decode_ms(model, seqs: list[list[int]], tokens: int, options: dict, draw_here: bool) -> float:
    """Milliseconds per decode step until every row has ended or `tokens` steps have run."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(seqs[0]) + tokens, batch_size=len(seqs), **options)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(seqs, dtype=np.int32))
    draws = torch.Generator().manual_seed(0)
    steps, started = 0, time.perf_counter()
    while not generator.is_done():
        if draw_here:
            generator.set_logits(forced_draw(np.asarray(generator.get_logits()), 1.0, draws))
        generator.generate_next_token()
        steps += 1
    return (time.perf_counter() - started) / steps * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="named model or directory")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    configure_environment()
    from transformers import AutoTokenizer

    model_dir = str(resolve_model(args.model))
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    model = open_model(converted(model_dir, "float32"), threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = load_rows("synthetic_math", "train", 1, 0, {})[0]["prompt"]
    ids = tokenizer(tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False)["input_ids"]
    sampled = {"do_sample": True, "temperature": 1.0, "random_seed": 0}
    variants = [("greedy (ORT's argmax)", {"do_sample": False}, False, "no: the argmax"),
                ("ORT's sampler, its top-50 default", {**sampled, "top_p": 1.0, "top_k": 50}, False, "no: the top 50"),
                ("ORT's sampler, top_k 0, top_p 1", {**sampled, "top_p": 1.0, "top_k": 0}, False, "yes"),
                ("torch's draw through set_logits (ort_sampler)", {"do_sample": False}, True, "yes")]
    ms = {label: min(decode_ms(model, [ids] * args.rows, args.tokens, options, draw)
                     for _ in range(args.repeats)) for label, options, draw, _ in variants}
    floor = ms[variants[0][0]]
    print(f"model {model_dir}; {args.rows} rows of a {len(ids)}-token prompt, at most {args.tokens} new tokens, "
          f"temperature 1, {threads} threads; best of {args.repeats}")
    print("| draw | whole distribution | ms per decode step | vs greedy |")
    print("| --- | --- | --- | --- |")
    for label, _, _, whole in variants:
        print(f"| {label} | {whole} | {ms[label]:.1f} | {ms[label] / floor:.2f} |")


if __name__ == "__main__":
    main()
