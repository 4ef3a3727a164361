"""GPU smoke check for one H200: SFT and GRPO under DeepSpeed ZeRO-2 and ZeRO-3 on a randomly
initialised ~1.5B-parameter Qwen3 (built here from the tiny tokenizer; nothing is downloaded),
through `posttrain run` and our stage code. Prints tokens per second and model FLOPs utilisation per
stage and writes them to a JSON file.

MFU = 6 x parameters x trained tokens / runtime / peak FLOP/s (989 TFLOP/s: H200 SXM, dense bf16).
Tokens are TRL's `num_tokens` (prompt and completion tokens, no padding) over the trainer's runtime;
for GRPO the runtime includes generation (Hugging Face generate; gpu_generation.py measures vLLM's
rate against it), so its figure is the end-to-end rate, not the optimiser's alone.

Usage: benchmarks/gpu_smoke.sh [--shrink] [--stages NAME ...] [--out FILE]
  (--shrink: a 2-layer model and 2 steps, for a CPU dry run)
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from recipe_runs import ROOT, fresh_home, latest_stages, run_recipe, table_header, table_row

H200_BF16_FLOPS = 989e12
FULL = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 32, "num_attention_heads": 12,
        "num_key_value_heads": 2, "head_dim": 128}
SHRUNK = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16}


def build_model(out: Path, dims: dict, home: Path) -> int:
    """A random Qwen3 of `dims` with the tiny tokenizer, saved in bf16; returns its parameter count."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    os.environ["POSTTRAIN_HOME"] = str(home)
    from pipeline.models.named import ensure_named_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_named_model("tiny-qwen3"))
    config = Qwen3Config(vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **dims)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


STAGES = ("sft_zero2", "sft_zero3", "grpo_zero2", "grpo_zero3")


def recipe(model: Path, shrink: bool, only: list[str]) -> dict:
    gpu = not shrink
    common = {"model": str(model), "evaluate": False, "bf16": gpu, "gradient_checkpointing": gpu,
              "learning_rate": 1e-5, "save_steps": 1000, "data": {"source": "synthetic_math", "n": 512}}
    sft = {**common, "kind": "sft", "max_steps": 2 if shrink else 30, "per_device_batch_size": 4 if shrink else 32,
           "max_length": 256}
    grpo = {**common, "kind": "grpo", "max_steps": 2 if shrink else 6, "per_device_batch_size": 4 if shrink else 16,
            "num_generations": 4 if shrink else 8, "max_completion_length": 16 if shrink else 256,
            # A random model earns no accuracy or format reward, so every advantage would be 0 and the
            # step would train nothing. The share of repeated tokens in its near-uniform samples differs
            # between completions, so a unigram repetition penalty gives GRPO a nonzero gradient.
            "rewards": [{"name": "accuracy_math"}, {"name": "format_think", "weight": 0.5},
                        {"name": "repetition", "params": {"ngram": 1}, "weight": 0.5}]}
    stages = [{"name": f"{kind}_{zero}", **cfg, "launcher": {"mode": "deepspeed", "ranks": 1, "deepspeed_config": zero}}
              for kind, cfg in (("sft", sft), ("grpo", grpo)) for zero in ("zero2", "zero3") if f"{kind}_{zero}" in only]
    return {"name": "gpu_smoke", "description": "SFT and GRPO under ZeRO-2 and ZeRO-3 on a random ~1.5B model",
            "launch": "benchmarks/gpu_smoke.sh", "stages": stages}


def gpu_name(shrink: bool) -> str:
    """The GPU's name for the results (nvidia-smi), or the CPU dry run's label."""
    if shrink:
        return "cpu (shrunk dry run)"
    return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip() or "unknown GPU"


def positive_seconds(text: str) -> float:
    if (value := float(text)) <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return value


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shrink", action="store_true", help="a 2-layer model and 2 steps per stage (CPU dry run)")
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES),
                    help="a subset, for a lease too short for all four (each takes 2-3 minutes on an H200)")
    ap.add_argument("--deadline-s", type=positive_seconds, default=660, help="stop the run this long after the start and "
                    "report the stages that finished (the script's backstop kills everything at 720 s)")
    ap.add_argument("--out", default=None, help="results JSON (default: benchmarks/results/gpu_smoke[-shrunk].json)")
    a = ap.parse_args()
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"gpu_smoke{'-shrunk' if a.shrink else ''}.json")
    work, env = fresh_home("gpu-smoke-")  # the model is built inside the home
    started = time.perf_counter()
    params = build_model(work / "model", SHRUNK if a.shrink else FULL, work)
    built = time.perf_counter() - started
    print(f"random Qwen3: {params / 1e6:,.1f} M parameters, built in {built:.0f} s", flush=True)
    (work / "gpu_smoke.yaml").write_text(yaml.safe_dump(recipe(work / "model", a.shrink, a.stages), sort_keys=False))
    code, _ = run_recipe(str(work / "gpu_smoke.yaml"), env, check=False, deadline=started + a.deadline_s)
    rows = []
    for stage in latest_stages(env):
        m = stage.get("metrics", {})
        rate = m.get("train/tokens_per_second")
        rows.append({"stage": stage["name"], "status": stage.get("status"), "steps": m.get("train/global_step"),
                     "tokens": m.get("train/tokens"), "runtime_s": m.get("train/runtime_s"), "tokens_per_s": rate,
                     "mfu": None if a.shrink or not rate else 6 * params * rate / H200_BF16_FLOPS})
    device = gpu_name(a.shrink)
    result = {"date": time.strftime("%Y-%m-%d"), "device": device, "parameters": params, "shrunk": a.shrink,
              "exit_code": code, "wall_s": round(time.perf_counter() - started, 1), "stages": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{device}, {params / 1e6:,.1f} M parameters, {result['wall_s']:.0f} s in all (posttrain run exit {code})")
    print(table_header("stage", "steps", "tokens", "runtime s", "tokens/s", "MFU"))
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(table_row(f"{r['stage']} ({r['status']})", f"{r['steps'] or 0:.0f}", f"{r['tokens'] or 0:.0f}",
                        f"{r['runtime_s'] or 0:.1f}", f"{r['tokens_per_s'] or 0:.0f}", mfu))
    print(f"results: {out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
