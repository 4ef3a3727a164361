"""Generation speed on this machine, every candidate engine side by side in one run, against the
machine's own limit, and what lower precision does to held-out results.

    .venv/bin/python benchmarks/bench_generation.py [--model smollm2-135m-instruct] [--accuracy-prompts 200]

1. The machine: memory bandwidth (a large tensor copy) and matmul FLOP/s (float32, bfloat16) measured
   here, and what torch uses (CPU capability, oneDNN). A decode step must read the weights once, so
   (weight bytes / bandwidth) is the floor per step at small batch and (2 x parameters x batch /
   FLOP/s) at large batch; the limit in tokens/s is batch / max(both).
2. Engines (SmolLM2 on the demo's held-out prompts, 80 new tokens as the demo's evaluation): HF
   generate float32 (today's baseline) and bfloat16, HF with a static cache and torch.compile,
   transformers' continuous batching (`generate_batch`), CTranslate2 float32 and int8, ONNX Runtime
   GenAI float32 and int4 (`--engines` picks some); greedy at
   batch 1 / 16 / 64 and sampled (4 per prompt) at batch 16. Tokens/s, ms per decode step, the
   ratio to HF float32 at the same batch, and greedy outputs identical to HF float32's.
3. Precision: HF float32 against each lower precision on `--accuracy-prompts` held-out prompts:
   accuracy and format rate with 95% intervals and the paired change (the same prompts); with
   `--precision-samples N`, each prompt's sampled pass rate over N draws too (what the filters use).
4. GRPO: what refreshing CTranslate2 with the policy's weights would cost per step (save + convert),
   next to the generation time it would save on one demo step (16 completions of 128 tokens).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_curation.sources import load_rows
from pipeline.models.named import resolve_model
from pipeline.store.home import configure_environment
from toolkit.core.stats import bootstrap_mean, paired_change, rate_interval
from toolkit.core.templates import render_prompt
from toolkit.core.text import is_well_formed
from toolkit.rewards.verifiers import score_rows
from toolkit.rollouts import SamplingSpec, open_engine, render
from toolkit.rollouts.engines import Engine
from toolkit.rollouts.hf import hf_sampler, load_for_generation
from toolkit.rollouts.sampling import complete


def machine_limits(threads: int) -> dict[str, float]:
    import torch

    src = torch.ones(128 * 2**20)  # 512 MB: far beyond the caches
    dst = torch.empty_like(src)
    dst.copy_(src)
    started = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    bandwidth = 5 * 2 * src.numel() * 4 / (time.perf_counter() - started)  # read + write
    out = {"threads": threads, "bandwidth_GBps": bandwidth / 1e9, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "onednn": torch.backends.mkldnn.is_available()}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(1024, 1024, dtype=dtype)
        a @ a
        started = time.perf_counter()
        for _ in range(3):  # bfloat16 without native support (AVX2) runs at 0.3 GFLOP/s: keep this short
            a @ a
        out[f"matmul_GFLOPs_{str(dtype).split('.')[1]}"] = 3 * 2 * 1024**3 / (time.perf_counter() - started) / 1e9
    return out


def limit_tokens_per_s(params: int, weight_bytes: int, batch: int, machine: dict) -> float:
    step = max(weight_bytes / (machine["bandwidth_GBps"] * 1e9), 2 * params * batch / (machine["matmul_GFLOPs_float32"] * 1e9))
    return batch / step


def compiled_engine(model_dir: str) -> Engine:
    """HF with a static KV cache and torch.compile: a benchmark candidate, not a posttrain engine."""
    import torch

    model, tokenizer = load_for_generation(model_dir)
    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward)
    sample = hf_sampler(model, tokenizer)
    return Engine("hf+static+compile", "float32", torch.get_num_threads(), tokenizer,
                  lambda prompts, spec, progress: complete(sample, tokenizer, prompts, spec))


def continuous_batching_tokens(model_dir: str, prompts: list, max_new_tokens: int) -> tuple[float, int]:
    """transformers' continuous batching (`generate_batch`, paged attention): seconds, tokens."""
    from transformers import GenerationConfig

    model, tokenizer = load_for_generation(model_dir)
    ids = [tokenizer(render(tokenizer, p), add_special_tokens=False)["input_ids"] for p in prompts]
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    started = time.perf_counter()
    out = model.generate_batch(inputs=ids, generation_config=config)
    return time.perf_counter() - started, sum(len(r.generated_tokens) for r in out.values())


def timed(engine: Engine, prompts: list, spec: SamplingSpec) -> tuple[float, list]:
    started = time.perf_counter()
    done = engine.complete(prompts, spec)
    return time.perf_counter() - started, done


def speed_table(model_dir: str, prompts: list, machine: dict, params: int, args) -> dict[str, list]:
    """tokens/s per engine and batch; returns each engine's greedy batch-16 texts for equality."""
    candidates = [tuple(e.split(":")) for e in args.engines]
    greedy_texts: dict[str, list] = {}
    base: dict[tuple, float] = {}
    print(f"{'engine':22s} {'mode':12s} {'batch':>5s} {'tokens/s':>9s} {'ms/step':>8s} {'x HF f32':>8s} "
          f"{'limit':>8s} {'same':>7s}")
    engines = [(f"{e} {p}", lambda e=e, p=p: open_engine(model_dir, e, p)) for e, p in candidates]
    if args.compile:
        engines.insert(2, ("hf+static+compile", lambda: compiled_engine(model_dir)))
    for label, make in engines:
        compiled = label.startswith("hf+static")
        # torch.compile recompiles for every new input shape: it gets one batch of 16, warmed up on
        # that same batch (the compile time is printed), so its row is its best case
        warm = (prompts[:16], SamplingSpec(max_new_tokens=args.max_new_tokens)) if compiled else (
            prompts[:2], SamplingSpec(max_new_tokens=8))
        try:
            engine = make()
            started = time.perf_counter()
            engine.complete(*warm)
            if compiled:
                print(f"{label:22s} compile and first batch: {time.perf_counter() - started:.0f} s")
        except Exception as e:  # a candidate that does not run here is a result too
            print(f"{label:22s} did not run: {type(e).__name__}: {str(e)[:160]}")
            continue
        runs = [("greedy", 16, prompts[:16], 1)] if compiled else [
            ("greedy", 1, prompts[:args.batch1_prompts], 1), ("greedy", 16, prompts, 1),
            ("greedy", 64, prompts, 1), ("sampled x4", 16, prompts[:len(prompts) // 4], 4)]
        for mode, batch, chosen, n in runs:
            spec = SamplingSpec(max_new_tokens=args.max_new_tokens, batch_size=max(1, batch // n), n=n,
                                temperature=0.7 if n > 1 else 0.0, top_p=0.95 if n > 1 else 1.0)
            seconds, done = timed(engine, chosen, spec)
            tokens = sum(c.tokens for cs in done for c in cs)
            steps = sum(max(c.tokens for c in [x for cs in done[i:i + spec.batch_size] for x in cs])
                        for i in range(0, len(done), spec.batch_size))
            rate = tokens / seconds
            key = (mode, batch)
            if label == "hf float32":
                base[key] = rate
            same = ""
            if mode == "greedy" and batch == 16:
                greedy_texts[label] = [cs[0].text for cs in done]
                ref = greedy_texts.get("hf float32")
                same = f"{sum(a == b for a, b in zip(ref, greedy_texts[label]))}/{len(greedy_texts[label])}" if ref else ""
            weight_bytes = params * {"int4": 0.5, "int8": 1, "bfloat16": 2}.get(label.split()[-1], 4)
            print(f"{label:22s} {mode:12s} {batch:5d} {rate:9.1f} {1e3 * seconds / max(1, steps):8.1f} "
                  f"{rate / base[key] if key in base else float('nan'):8.2f} "
                  f"{limit_tokens_per_s(params, weight_bytes, batch, machine):8.0f} {same:>7s}", flush=True)
    if args.continuous_batching:
        try:
            seconds, tokens = continuous_batching_tokens(model_dir, prompts, args.max_new_tokens)
            print(f"{'hf generate_batch':22s} {'greedy':12s} {'all':>5s} {tokens / seconds:9.1f}  "
                  f"(continuous batching; x HF f32 batch 16: {tokens / seconds / base[('greedy', 16)]:.2f})")
        except Exception as e:
            print(f"{'hf generate_batch':22s} did not run: {type(e).__name__}: {str(e)[:200]}")
    return greedy_texts


def precision_table(model_dir: str, rows: list[dict], args) -> None:
    prompts = [render_prompt("chat", r) for r in rows]
    spec = SamplingSpec(max_new_tokens=args.max_new_tokens, batch_size=32)
    scored = {}
    for engine, precision in (e.split(":") for e in args.precision_engines):
        texts = [cs[0] for cs in open_engine(model_dir, engine, precision).texts(prompts, spec)]
        scored[f"{engine} {precision}"] = (score_rows(rows, texts), [float(is_well_formed(t)) for t in texts])
    reference = args.precision_engines[0].replace(":", " ")
    print(f"\n{len(rows)} held-out prompts, greedy, {args.max_new_tokens} new tokens; {reference} stands for "
          "float32 (its greedy outputs equal HF float32's, table above)")
    ref_acc, ref_fmt = scored[reference]
    for label, (acc, fmt) in scored.items():
        a, f = rate_interval(acc), rate_interval(fmt)
        line = (f"{label:14s} accuracy {a['mean']:.3f} [{a['lo']:.3f}, {a['hi']:.3f}]"
                f"  format {f['mean']:.3f} [{f['lo']:.3f}, {f['hi']:.3f}]")
        if label != reference:
            da, df = paired_change(ref_acc, acc), paired_change(ref_fmt, fmt)
            line += (f"  change: accuracy {da['delta']:+.3f} [{da['lo']:+.3f}, {da['hi']:+.3f}]"
                     f" format {df['delta']:+.3f} [{df['lo']:+.3f}, {df['hi']:+.3f}]")
        print(line)
    if args.precision_samples:
        sampled_precision(model_dir, rows, prompts, args)


def sampled_precision(model_dir: str, rows: list[dict], prompts: list, args) -> None:
    """What the sampling filters estimate: each prompt's pass rate over `--precision-samples` draws
    at temperature 1 (the whole distribution), per precision, and its paired change on the same
    prompts (bootstrap: the rates are not 0/1). Different precisions draw different streams, so
    only the distribution can agree, not the tokens."""
    n = args.precision_samples
    spec = SamplingSpec(max_new_tokens=args.max_new_tokens, temperature=1.0, n=n, batch_size=16, seed=3)
    rates = {}
    for engine, precision in (e.split(":") for e in args.precision_engines):
        completions = open_engine(model_dir, engine, precision).texts(prompts, spec)
        flat = score_rows([r for r in rows for _ in range(n)], [c for cs in completions for c in cs])
        rates[f"{engine} {precision}"] = [sum(flat[i * n:(i + 1) * n]) / n for i in range(len(rows))]
    reference = args.precision_engines[0].replace(":", " ")
    print(f"\nsampled pass rate per prompt ({n} draws at temperature 1, {len(rows)} prompts, mean and 95% bootstrap):")
    for label, values in rates.items():
        lo, hi = bootstrap_mean(values)
        line = f"{label:14s} pass rate {sum(values) / len(values):.3f} [{lo:.3f}, {hi:.3f}]"
        if label != reference:
            d = paired_change(rates[reference], values)
            line += f"  change {d['delta']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"
        print(line)


def grpo_refresh(model_dir: str, prompts: list, args) -> None:
    """One demo GRPO step's generation (16 completions of 128 tokens) by HF float32 and by each
    converting engine, and the cost of giving that engine new weights (save the policy, convert)."""
    from toolkit.rollouts import ct2, ort
    from toolkit.rollouts.engines import keep_conversions_in

    spec = SamplingSpec(max_new_tokens=128, temperature=1.0, n=4, batch_size=4)
    chosen = prompts[:4]
    hf_s, _ = timed(open_engine(model_dir, "hf", "float32"), chosen, spec)
    print(f"\nGRPO step generation (16 x 128 tokens, sampled): HF float32 {hf_s:.1f} s")
    model, tokenizer = load_for_generation(model_dir)
    for engine, precision, convert in (("ct2", "int8", ct2.converted),
                                       ("ort", "float32", lambda d: ort.converted(d, "float32"))):
        gen_s, _ = timed(open_engine(model_dir, engine, precision), chosen, spec)
        scratch = Path(tempfile.mkdtemp(prefix="bench-refresh-"))
        try:
            keep_conversions_in(scratch)
            started = time.perf_counter()
            model.save_pretrained(scratch / "policy")
            tokenizer.save_pretrained(scratch / "policy")
            convert(str(scratch / "policy"))
            refresh = time.perf_counter() - started
        finally:
            keep_conversions_in(None)
            shutil.rmtree(scratch, ignore_errors=True)
        print(f"  {engine} {precision}: generation {gen_s:.1f} s, weight refresh (save + convert) {refresh:.1f} s -> "
              f"step {gen_s + refresh:.1f} s ({(gen_s + refresh) / hf_s:.2f}x HF)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=64, help="held-out prompts for the speed table")
    ap.add_argument("--batch1-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--accuracy-prompts", type=int, default=200, help="0 = skip the precision table")
    ap.add_argument("--engines", nargs="+", default=["hf:float32", "hf:bfloat16", "ct2:float32", "ct2:int8",
                                                      "ort:float32", "ort:int4"], help="engine:precision, HF float32 first")
    ap.add_argument("--precision-engines", nargs="+", default=["ct2:float32", "ct2:int8", "hf:bfloat16", "ort:int4"],
                    help="engine:precision for the precision table, a float32 one first (the reference)")
    ap.add_argument("--precision-samples", type=int, default=0,
                    help="also each prompt's sampled pass rate over this many draws, per precision")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--continuous-batching", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--grpo", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--speed", action=argparse.BooleanOptionalAction, default=True, help="the engines' speed table")
    args = ap.parse_args()
    configure_environment()
    import torch

    model_dir = resolve_model(args.model)
    machine = machine_limits(torch.get_num_threads())
    params = sum(p.numel() for p in load_for_generation(model_dir)[0].parameters())
    print(f"{args.model}: {params / 1e6:.1f}M parameters; machine: " + ", ".join(
        f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in machine.items()))
    rows = load_rows("synthetic_math", "eval", max(args.prompts, args.accuracy_prompts), 0, {})
    prompts = [render_prompt("chat", r) for r in rows[:args.prompts]]
    if args.speed:
        speed_table(model_dir, prompts, machine, params, args)
    if args.accuracy_prompts:
        precision_table(model_dir, rows[:args.accuracy_prompts], args)
    if args.grpo:
        grpo_refresh(model_dir, prompts, args)


if __name__ == "__main__":
    main()
