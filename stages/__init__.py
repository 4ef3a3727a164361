"""Stage kinds: one module per kind, each a small pydantic config (the recipe schema and the Prefect
UI form) and `run(cfg, ctx) -> StageOutput`, registered by one line in `registry.py`. Heavy
imports (torch, transformers, TRL) stay inside `run`, so validating a recipe never loads them."""
