"""vLLM against HF generate on one GPU, both through posttrain's rollout interface (toolkit.rollouts
`open_engine(...).complete`): the fast-generation issue's GPU goal, vLLM rollouts at least 10x HF
generate on the same GPU.

The workload is a GRPO rollout batch: the same prompts, n samples each, temperature 1, top_p 1,
`--max-new-tokens` each, in bf16, on the random ~1.5B Qwen3 that gpu_smoke.py trains. Its samples are
near-uniform over the tiny tokenizer's 642 tokens, so some of them meet the end-of-turn token before
256 (on the H200: 0.27-0.28 of HF's, 0.16-0.17 of vLLM's; the share finished is reported). The rate
is the tokens each engine generated over its generation time. Loading (and vLLM's compilation, CUDA
graph capture and KV-cache allocation) is timed apart, as is a one-prompt warm-up call. HF generates
`--hf-batch` rows at a time (posttrain's `batch_size`); vLLM schedules all rows at once, which is
the point of it. Each engine runs in its own process: vLLM sizes its KV cache from the GPU memory
free at its start.

Also run on each engine: a budgeted call (thinking budget 16, the stop-thinking string, then the
answer phase) on a few prompts, to show the two-phase path runs there and counts the same way; and a
greedy pass (16 prompts, 64 tokens) whose completions are compared between the engines text for
text. Run with `--precision float32` for that comparison to mean anything: in bf16 the two engines'
kernels round differently and a near-uniform random model's argmax is fragile.

Usage: benchmarks/gpu_generation.py [--prompts 32] [--n 8] [--max-new-tokens 256] [--hf-batch 64]
       [--engines hf vllm] [--precision bfloat16|float32] [--shrink] [--out FILE]
  (--shrink: the 2-layer model on CPU, HF only: a dry run of everything but vLLM)
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from gpu_smoke import FULL, SHRUNK, build_model, gpu_name
from recipe_runs import ROOT, fresh_home, positive_int, table_header, table_row

BUDGET_PROMPTS, BUDGET, BUDGET_ANSWER = 8, 16, 32
GREEDY_PROMPTS, GREEDY_TOKENS = 16, 64


def prompts(count: int) -> list[list[dict]]:
    """Chat prompts shaped like the math recipes' (the model is random, so only their length matters)."""
    return [[{"role": "user", "content": f"What is {17 * i + 3} times {i % 9 + 2}, minus {i * i % 50}? "
                                         "Think step by step, then give the answer in \\boxed{}."}] for i in range(count)]


def measure(engine_name: str, model_dir: str, a: argparse.Namespace) -> dict:
    """One engine in this process: load, warm up, the timed rollout batch, the budgeted call."""
    import torch

    from toolkit.rollouts import SamplingSpec, open_engine

    precision = a.precision or ("bfloat16" if torch.cuda.is_available() else "float32")
    started = time.perf_counter()
    engine = open_engine(model_dir, engine_name, precision)
    loaded = time.perf_counter()
    engine.complete(prompts(1), SamplingSpec(max_new_tokens=8, temperature=1.0, seed=1))
    warmed = time.perf_counter()
    spec = SamplingSpec(max_new_tokens=a.max_new_tokens, temperature=1.0, top_p=1.0, n=a.n,
                        batch_size=a.hf_batch, seed=0)
    rows = engine.complete(prompts(a.prompts), spec)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    generated = time.perf_counter()
    completions = [c for row in rows for c in row]
    tokens = sum(c.tokens for c in completions)
    budgeted = [c for row in engine.complete(prompts(BUDGET_PROMPTS), SamplingSpec(
        max_new_tokens=BUDGET_ANSWER, thinking_budget=BUDGET, answer_max_new_tokens=BUDGET_ANSWER,
        temperature=1.0, seed=2)) for c in row]
    greedy = [row[0].text for row in engine.complete(prompts(GREEDY_PROMPTS), SamplingSpec(max_new_tokens=GREEDY_TOKENS))]
    return {"engine": engine.describe(), "load_s": round(loaded - started, 1), "warmup_s": round(warmed - loaded, 2),
            "completions": len(completions), "tokens": tokens, "generate_s": round(generated - warmed, 2),
            "tokens_per_s": round(tokens / (generated - warmed), 1),
            "finished_share": round(sum(c.finished for c in completions) / len(completions), 3),
            "budget": {"completions": len(budgeted), "budget_hit": sum(c.budget_hit for c in budgeted),
                       "max_thinking_tokens": max(c.thinking_tokens or 0 for c in budgeted),
                       "stop_thinking_in_text": sum(spec.stop_thinking in c.text for c in budgeted)},
            "greedy_texts": greedy,
            # vLLM's memory is its engine process's, not this one's
            "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)
            if torch.cuda.is_available() and engine_name == "hf" else None}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=positive_int, default=32)
    ap.add_argument("--n", type=positive_int, default=8, help="samples per prompt (GRPO's group size)")
    ap.add_argument("--max-new-tokens", type=positive_int, default=256)
    ap.add_argument("--hf-batch", type=positive_int, default=64, help="rows per HF generate call")
    ap.add_argument("--engines", nargs="+", choices=("hf", "vllm"), default=["hf", "vllm"])
    ap.add_argument("--precision", choices=("bfloat16", "float32"), default=None,
                    help="default: bfloat16 on a GPU, float32 on CPU")
    ap.add_argument("--shrink", action="store_true", help="the 2-layer model, HF only, on CPU")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", nargs=3, metavar=("ENGINE", "MODEL", "JSON"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        engine, model, out = a.worker
        Path(out).write_text(json.dumps(measure(engine, model, a)))
        return 0
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"gpu_generation{'-shrunk' if a.shrink else ''}.json")
    work, env = fresh_home("gpu-generation-")
    params = build_model(work / "model", SHRUNK if a.shrink else FULL, work)
    print(f"random Qwen3: {params / 1e6:,.1f} M parameters; {a.prompts} prompts x {a.n} samples x "
          f"{a.max_new_tokens} new tokens", flush=True)
    results = {}
    for name in a.engines:
        result_file = work / f"{name}.json"
        forwarded = ["--prompts", str(a.prompts), "--n", str(a.n), "--max-new-tokens", str(a.max_new_tokens),
                     "--hf-batch", str(a.hf_batch), *(["--precision", a.precision] if a.precision else [])]
        code = subprocess.run([sys.executable, __file__, *forwarded, "--worker", name, str(work / "model"),
                               str(result_file)], env=env).returncode
        results[name] = json.loads(result_file.read_text()) if code == 0 else {"error": f"exit {code}"}
        print(f"{name}: { {k: v for k, v in results[name].items() if k != 'greedy_texts'} }", flush=True)
    hf, vllm = results.get("hf", {}), results.get("vllm", {})
    ratio = vllm["tokens_per_s"] / hf["tokens_per_s"] if "tokens_per_s" in hf and "tokens_per_s" in vllm else None
    same = None
    if "greedy_texts" in hf and "greedy_texts" in vllm:
        same = sum(x == y for x, y in zip(hf["greedy_texts"], vllm["greedy_texts"]))
    device = gpu_name(a.shrink)
    summary = {"date": time.strftime("%Y-%m-%d"), "device": device, "parameters": params, "prompts": a.prompts,
               "n": a.n, "max_new_tokens": a.max_new_tokens, "hf_batch": a.hf_batch, "results": results,
               "vllm_over_hf": None if ratio is None else round(ratio, 1),
               "greedy_same": None if same is None else f"{same}/{GREEDY_PROMPTS}"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n{device}, {params / 1e6:,.1f} M parameters")
    print(table_header("engine", "load s", "tokens", "generate s", "tokens/s", "finished"))
    for r in results.values():
        if "tokens_per_s" in r:
            print(table_row(r["engine"], f"{r['load_s']:.1f}", str(r["tokens"]), f"{r['generate_s']:.1f}",
                            f"{r['tokens_per_s']:.0f}", f"{r['finished_share']:.2f}"))
    if ratio is not None:
        print(f"vLLM / HF generate: {ratio:.1f}x tokens/s")
    if same is not None:
        print(f"greedy completions identical on both engines: {same}/{GREEDY_PROMPTS}")
    print(f"results: {out}")
    return 0 if all("tokens_per_s" in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
