#!/usr/bin/env bash
# GPU smoke check for one H200: SFT and GRPO under DeepSpeed ZeRO-2 and ZeRO-3 on a random ~1.5B-parameter
# model built here; prints tokens/s and MFU and writes benchmarks/results/gpu_smoke.json. On an H200
# (2026-12-04) each stage took 2-3 minutes, most of it starting, loading and saving the 3 GB model, so
# the four need about 10 minutes; a lease shorter than that runs a subset with --stages.
#   benchmarks/gpu_smoke.sh              on the GPU machine (after `make setup OV_EXPORT=0`)
#   benchmarks/gpu_smoke.sh --stages grpo_zero2 grpo_zero3
#   benchmarks/gpu_smoke.sh --shrink     CPU dry run: a 2-layer model, 2 steps per stage
#   benchmarks/gpu_smoke.sh generation   vLLM against HF generate on the same model (gpu_generation.py;
#                                        the [vllm] extra; about 4 minutes on an H200)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = generation ]; then
  shift
  exec timeout 720 .venv/bin/python benchmarks/gpu_generation.py "$@"
fi
exec timeout 720 .venv/bin/python benchmarks/gpu_smoke.py "$@"
