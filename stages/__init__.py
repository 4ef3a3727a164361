"""Stage kinds. One module per kind: a small pydantic config (the recipe schema and the Prefect UI
form) plus `run(spec)`, which the worker calls. Heavy imports stay inside `run` so that validating
a recipe never loads torch."""
