"""`posttrain`: run, validate, list, show, serve, ui, models, generate, data, curate. Exit 2 on a bad
recipe, before any compute. Subcommands import what they need when they run: Prefect and the flow
take seconds to import, and `posttrain validate` or `--help` should not wait for them."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys

from pipeline.store.home import configure_environment


def _load(args):
    from pipeline.recipe import load_recipe
    return load_recipe(args.recipe, args.profile, args.set)


def cmd_validate(args) -> int:
    resolved = _load(args)
    stages = ", ".join(f"{s.name} ({s.kind})" for s in resolved.recipe.stages)
    print(f"{resolved.source}: ok (profile {args.profile}): {stages}")
    return 0


def cmd_run(args) -> int:
    resolved = _load(args)  # refuse a bad recipe before Prefect or any model starts
    # Prefect cancels a flow run with SIGTERM; turn it into an exception so stage workers get killed.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C stops it, even when started with SIGINT ignored
    from pipeline.launch import prefect_api, warm
    from pipeline.store import runs

    def warm_up():  # overlaps imports and MLflow's store set-up with a temporary server's start
        warm.start_early(resolved.recipe)  # and the stage workers' imports, when a stage will train
        import pipeline.flow  # noqa: F401
        from pipeline.tracking import mlflow_runs

        mlflow_runs.client()

    print(f"posttrain: using {prefect_api.connect(warm_up)}", flush=True)
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from pipeline.flow import run_recipe

    run_id = runs.new_run_id(args.recipe.rsplit("/", 1)[-1].removesuffix(".yaml"))
    # Prefect emits a flow-run heartbeat event every 180 s by default, for an automation that marks
    # silent runs Crashed; we set none up, and Prefect waits up to 1 s for the heartbeat thread at the
    # end of every flow. Off unless the user sets PREFECT_FLOWS_HEARTBEAT_FREQUENCY (env or profile).
    quiet = temporary_settings(set_defaults={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
    try:
        # The UI offers shipped recipes by name; the CLI also takes a recipe file's path, which the
        # Literal parameter type would refuse. _load above has already validated it fully.
        with quiet:
            run_recipe.with_options(validate_parameters=False)(args.recipe, args.profile, args.set, run_id=run_id)
        return 0
    except KeyboardInterrupt:  # Ctrl-C: the stage's worker was stopped, its checkpoints kept; a rerun resumes
        print(f"\nrun {run_id} interrupted; `posttrain run` again resumes it", file=sys.stderr)
        return 130
    except Exception as e:  # the stage error (with its worker log tail) was logged by Prefect
        down = services_down()
        with contextlib.suppress(OSError):  # no record: the run failed before it wrote one
            if down and (record := runs.load(run_id))["status"] == "completed":
                # Every stage is published and filed; only the flow run's last state update was lost.
                record["services_closed"] = False  # the next run or `posttrain ui` closes it there
                runs.save(record)
                print(f"\nrun {run_id} completed, but {'; '.join(down)}: its flow run shows Running until the next "
                      "`posttrain run` or `posttrain ui` closes it", file=sys.stderr)
                return 0
        print(f"\nrun {run_id} failed: {e}", file=sys.stderr)
        for service in down:
            print(f"posttrain: {service}. Stages that finished are published; `posttrain run` again resumes "
                  "once it is back, and closes this run's open Prefect and MLflow runs.", file=sys.stderr)
        return 1
    finally:
        try:
            print("\n" + runs.format_table(runs.find(run_id)))
        except LookupError:
            pass


def services_down() -> list[str]:
    """The services a failed run talks to that no longer answer, each named with its address: a
    connection error deep in a client library rarely says which service it was."""
    from pipeline.launch import prefect_api
    from pipeline.tracking import mlflow_runs

    down = []
    if (url := os.environ.get("PREFECT_API_URL")) and not prefect_api.healthy(url):
        down.append(f"the Prefect API at {url} does not answer")
    if mlflow_runs.is_server() and not prefect_api.healthy(mlflow_runs.tracking_uri().rstrip("/")):  # MLflow's /health
        down.append(f"the MLflow tracking server at {mlflow_runs.tracking_uri()} does not answer")
    return down


def cmd_list(args) -> int:
    import yaml

    from pipeline.recipe import list_profiles, list_recipes, recipe_path
    from pipeline.store import runs

    print("recipes:")
    for name in list_recipes():
        r = yaml.safe_load(recipe_path(name).read_text())  # no profile here, so no full validation
        print(f"  {name:12s} {len(r.get('stages', []))} stages  {r.get('description', '')}\n"
              f"  {'':12s} launch: {r.get('launch') or f'posttrain run {name}'}")
    print("profiles: " + ", ".join(list_profiles()))
    recent = runs.all_runs()[-args.limit:]
    print("recent runs:" if recent else "recent runs: none")
    for r in recent:
        stages = " ".join(f"{s['name']}:{s['status']}{'*' if s.get('cached') else ''}" for s in r["stages"])
        print(f"  {r['id']}  {r['status']:9s} {stages}")
    return 0


def cmd_show(args) -> int:
    from pipeline.store import runs
    record = runs.find(args.run)
    print(json.dumps(record, indent=2, default=str) if args.json else runs.format_table(record))
    return 0


def cmd_compare(args) -> int:
    from pipeline.store import runs
    rows = runs.comparison([runs.find(ref) for ref in args.runs])
    print(json.dumps(rows, indent=2) if args.json else runs.format_comparison(rows))
    return 0


def count(text: str) -> int:
    """A whole number of 0 or more, for argparse (`--keep-runs -1` is a mistake, not 0)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 0 or more")
    return int(text)


def cmd_verify(args) -> int:
    """Check published stage outputs against the checksums recorded when they were published."""
    from pipeline.store import runs
    from pipeline.store.verify import published_dirs, verify_stages
    from toolkit.core.files import corrupt_files

    if args.run:
        stages = runs.find(args.run)["stages"]
        problems, checked = verify_stages(stages), sum(1 for s in stages if s.get("output_dir"))
    else:
        dirs = published_dirs()
        problems, checked = [bad for d in dirs for bad in corrupt_files(d)], len(dirs)
    for line in problems:
        print(f"corrupt: {line}")
    print(f"{checked} published stage outputs checked, {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


def cmd_gc(args) -> int:
    from pipeline.store.gc import collect

    collect(args.keep_runs, args.dry_run)
    return 0


def cmd_ui(args) -> int:
    from pipeline.cli.ui import start_uis
    return start_uis(args.host, args.prefect_port, args.mlflow_port)


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and flag (the docs' command examples are checked against it)."""
    p = argparse.ArgumentParser(prog="posttrain", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn, helptext in [("run", cmd_run, "run a recipe as a Prefect flow"),
                               ("validate", cmd_validate, "check a recipe without running it")]:
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("recipe", help="recipe name (recipes/NAME.yaml) or path to a YAML file")
        sp.add_argument("--profile", default=None, help="profile in recipes/profiles/ (tiny, demo, gpu)")
        sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field, e.g. stages.cold_start.max_steps=10")
        sp.set_defaults(fn=fn)
    sp = sub.add_parser("list", help="recipes, profiles and recent runs")
    sp.add_argument("--limit", type=int, default=10)
    sp.set_defaults(fn=cmd_list)
    sp = sub.add_parser("show", help="stages of a run: status, duration, metrics, MLflow ids")
    sp.add_argument("run", nargs="?", default="latest")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_show)
    sp = sub.add_parser("compare", help="every stage's held-out metrics side by side, within and across runs")
    sp.add_argument("runs", nargs="*", default=["latest"], help="run ids (prefixes), MLflow or Prefect ids; default latest")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_compare)
    sp = sub.add_parser("gc", help="remove stage outputs and checkpoints that no kept run references")
    sp.add_argument("--keep-runs", type=count, default=5, help="keep the outputs of the newest N runs (default 5)")
    sp.add_argument("--dry-run", action="store_true", help="only print what would go")
    sp.set_defaults(fn=cmd_gc)
    sp = sub.add_parser("verify", help="check published stage outputs against their recorded checksums")
    sp.add_argument("run", nargs="?", default=None, help="a run id (or latest); default: every output in the home")
    sp.set_defaults(fn=cmd_verify)
    sp = sub.add_parser("ui", help="start the Prefect and MLflow UIs on localhost")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--prefect-port", type=int, default=4200)
    sp.add_argument("--mlflow-port", type=int, default=5000)
    sp.set_defaults(fn=cmd_ui)
    from pipeline.cli.cluster import add_parsers as add_cluster
    from pipeline.cli.curate import add_parser as add_curate
    from pipeline.cli.eval import add_parser as add_eval
    from pipeline.cli.tools import add_parsers
    add_parsers(sub)
    add_eval(sub)
    add_curate(sub)
    add_cluster(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    configure_environment()
    args = build_parser().parse_args(argv)
    from pipeline.recipe import RecipeError
    try:
        return args.fn(args)
    except RecipeError as e:
        print("recipe refused:\n" + "\n".join(f"  {line}" for line in e.errors), file=sys.stderr)
        return 2
    except (LookupError, FileNotFoundError, ImportError, ValueError) as e:
        print(f"posttrain: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
