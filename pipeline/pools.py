"""The recipes as Prefect deployments on a work pool: `posttrain serve --pool NAME`.

Without `--pool`, `posttrain serve` runs the deployments in its own process (zero setup). With it,
each recipe becomes a deployment of the named pool and the command returns; the pool's workers run
the flows: a `process` worker on a GPU machine with this repo, or a `docker` / `kubernetes` pool whose
base job template (infra/prefect/) runs the worker image, where the repo lies at the same path
(/opt/posttrain) as on the machine that deploys. Create the pools with infra/prefect/create-work-pool.sh.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.recipe import REPO_ROOT, list_recipes

ENTRYPOINT = "pipeline/flow.py:run_recipe"


def deploy_to_pool(pool: str, profile: str, source: Path = REPO_ROOT, image: str | None = None) -> list[str]:
    """One deployment per recipe on `pool`, named `<recipe>-<pool>` so that deploying to a second pool
    does not move the first pool's deployments; returns `<flow>/<deployment>` names. The pool must exist."""
    from prefect import Flow
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.read_work_pool(pool)  # a clear ObjectNotFound before anything is deployed
    flow = Flow.from_source(source=str(source), entrypoint=ENTRYPOINT)
    names = []
    for name in list_recipes():
        flow.deploy(
            name=f"{name}-{pool}", work_pool_name=pool, image=image, build=False, push=False, print_next_steps=False,
            parameters={"recipe": name, "profile": profile, "overrides": []},
            description=f"posttrain recipe {name} (profile {profile}); any recipe, profile and --set overrides "
                        "can be chosen in the run form")
        names.append(f"{flow.name}/{name}-{pool}")
    return names
