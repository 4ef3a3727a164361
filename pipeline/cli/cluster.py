"""`posttrain serve` (the recipes as Prefect deployments, served here or on a work pool) and
`posttrain node` (a follower node of multi-node stages)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

STOP_GRACE_S = 8  # `serve` exits this long after SIGTERM/SIGINT at most, whatever its API's state
SERVING = "POSTTRAIN_SERVING"  # set in the serving child, which the supervising parent stops


def supervise_serve() -> int:
    """Run `posttrain serve` as a child and stop it on SIGTERM/SIGINT: Prefect's own shutdown pauses
    every deployment through the API, and with the server gone it waits on it for good; the child
    gets the signal and STOP_GRACE_S to end, then it and its flow runs are killed as a group."""
    child = subprocess.Popen([sys.argv[0], *sys.argv[1:]], env={**os.environ, SERVING: "1"}, start_new_session=True)
    got: list[tuple[int, float]] = []

    def stop(signum, _frame):
        got.append((signum, time.monotonic()))
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while child.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=0.5)
        if got and child.poll() is None and time.monotonic() - got[0][1] > STOP_GRACE_S:
            print(f"posttrain serve: still shutting down after {STOP_GRACE_S} s (its Prefect API does not answer?); "
                  "stopped", file=sys.stderr, flush=True)
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return 128 + got[0][0] if got else child.returncode


def cmd_serve(args) -> int:
    from pipeline.launch import prefect_api

    if not args.pool and not os.environ.get(SERVING):
        return supervise_serve()

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
    from pipeline.launch.nodes import follow

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
