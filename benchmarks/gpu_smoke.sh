#!/usr/bin/env bash
# GPU smoke check for one H200 (under 8 minutes): SFT and GRPO under DeepSpeed ZeRO-2 and ZeRO-3 on a
# random ~1.5B-parameter model built here; prints tokens/s and MFU and writes benchmarks/results/gpu_smoke.json.
#   benchmarks/gpu_smoke.sh              on the GPU machine (after `make setup`)
#   benchmarks/gpu_smoke.sh --shrink     CPU dry run: a 2-layer model, 2 steps per stage
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout 480 .venv/bin/python benchmarks/gpu_smoke.py "$@"
