#!/usr/bin/env bash
# Create a process work pool and start a worker for it on this (GPU) machine, then register the
# deployments in infra/prefect/prefect.yaml. Needs a running Prefect server (PREFECT_API_URL).
set -euo pipefail
cd "$(dirname "$0")/../.."
export POSTTRAIN_REPO="$PWD"
prefect work-pool create posttrain --type process --overwrite
prefect --no-prompt deploy --prefect-file infra/prefect/prefect.yaml --all
exec prefect worker start --pool posttrain
