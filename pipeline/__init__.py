"""The orchestrator: a recipe in, a chain of trained, evaluated, tracked stages out.

Its own modules are the flow, top to bottom: `recipe.py` (with `yaml_files.py` and
`recipe_checks.py`) reads and validates a recipe, `plan.py` turns each stage into a plan with a
cache key, `flow.py` runs the plans as Prefect tasks, `worker.py` is the process that runs one
stage's kind, `gates.py` judges results, `crashed_runs.py` closes what dead runs left open, and
`pools.py` deploys recipes to work pools.

Subpackages, each importing only those below it (import-linter, pyproject.toml):
  cli/       `posttrain` and its subcommands; the only place that parses arguments
  models/    named models, model references, tokenizer checks
  launch/    starting processes: workers, DeepSpeed ranks, nodes, rollout servers, the Prefect API
  tracking/  MLflow: runs, metrics, figures, logged models, the registry (independent of launch/)
  store/     the home and its records: paths, locks, run records, gc, output checks
"""
