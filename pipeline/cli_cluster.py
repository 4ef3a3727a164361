"""`posttrain serve` (the recipes as Prefect deployments, served here or on a work pool) and
`posttrain node` (a follower node of multi-node stages)."""

from __future__ import annotations

import os
import sys


def cmd_serve(args) -> int:
    from pipeline import prefect_api

    if args.pool:
        if not os.environ.get("PREFECT_API_URL") and not prefect_api.running_server():
            print("posttrain serve --pool: deployments live on a Prefect server; set PREFECT_API_URL "
                  "(or run `posttrain ui` for this POSTTRAIN_HOME)", file=sys.stderr)
            return 2
        print(f"posttrain: using {prefect_api.connect()}", flush=True)
        from pipeline.pools import deploy_to_pool

        names = deploy_to_pool(args.pool, args.profile, image=args.image)
        print(f"deployed {len(names)} recipes to work pool {args.pool!r}: {', '.join(names)}; a pool worker runs "
              f"them: start one from the UI or with `prefect deployment run {names[0]}`")
        return 0
    print(f"posttrain: using {prefect_api.connect()}", flush=True)
    from prefect import serve

    from pipeline.flow import run_recipe
    from pipeline.recipe import list_recipes

    deployments = [run_recipe.to_deployment(name=name, description=f"posttrain recipe {name}",
                                            parameters={"recipe": name, "profile": args.profile, "overrides": []})
                   for name in list_recipes()]
    print(f"serving {len(deployments)} deployments: {', '.join(list_recipes())}; launch them from the Prefect UI")
    serve(*deployments)
    return 0


def cmd_node(args) -> int:
    from pipeline.nodes import follow

    return follow(args.rank, once=args.once)


def add_parsers(sub) -> None:
    sp = sub.add_parser("serve", help="serve one Prefect deployment per recipe (here, or on a work pool)")
    sp.add_argument("--profile", default="tiny")
    sp.add_argument("--pool", default=None, help="deploy to this Prefect work pool and return; its workers run them")
    sp.add_argument("--image", default=None, help="with --pool: the worker image (docker, kubernetes pools)")
    sp.set_defaults(fn=cmd_serve)
    sp = sub.add_parser("node", help="a follower node of multi-node stages (launcher no_ssh): joins the "
                        "stages the head node posts under $POSTTRAIN_HOME/nodes")
    sp.add_argument("--rank", type=int, required=True, help="this node's rank, 1..nodes-1 (the head is 0)")
    sp.add_argument("--once", action="store_true", help="exit after one stage, with its launcher's exit code")
    sp.set_defaults(fn=cmd_node)
