#!/usr/bin/env bash
# Create a posttrain work pool on the Prefect server at PREFECT_API_URL and deploy every recipe to it.
#
#   infra/prefect/create-work-pool.sh process|docker|kubernetes [POOL] [PROFILE]
#
# process     flow runs are subprocesses of a worker on a GPU machine with this repo installed:
#             then run `prefect worker start --pool POOL` there.
# docker      flow runs are containers of the worker image (infra/Dockerfile.worker), with
#             POSTTRAIN_HOME mounted from the host (infra/prefect/docker-job-template.json);
#             the worker needs `pip install prefect-docker`.
# kubernetes  flow runs are Jobs of the worker image with GPU requests and a shared POSTTRAIN_HOME
#             claim (infra/prefect/kubernetes-job-template.json); the worker needs
#             `pip install prefect-kubernetes` and runs in the cluster.
# Docker and Kubernetes flow runs find posttrain at /opt/posttrain; deploy from the image so the
# deployments name that path: docker run -e PREFECT_API_URL posttrain-worker infra/prefect/create-work-pool.sh kubernetes
set -euo pipefail
type=${1:?usage: $0 process|docker|kubernetes [POOL] [PROFILE]}
pool=${2:-posttrain-$type}
profile=${3:-gpu}
cd "$(dirname "$0")/../.."
case "$type" in
  process) template=() ; image=() ;;
  docker|kubernetes) template=(--base-job-template "infra/prefect/$type-job-template.json")
                     image=(--image "${POSTTRAIN_IMAGE:-posttrain-worker:latest}") ;;
  *) echo "unknown pool type $type: process, docker or kubernetes" >&2; exit 2 ;;
esac
prefect --no-prompt work-pool create "$pool" --type "$type" "${template[@]}" --overwrite
posttrain serve --pool "$pool" --profile "$profile" "${image[@]}"
echo "next: prefect worker start --pool $pool   (where the flow runs should start)"
