"""Stage kinds: one module per kind, each a small pydantic config (the recipe schema and the Prefect
UI form) and `run(cfg, ctx) -> StageOutput`, registered by one line in `registry.py`; beside them
the typed contracts with the flow (`contracts.py`), the runtime a kind runs in (`runtime.py`) and
the held-out evaluation (`evaluate.py`). Heavy imports (torch, transformers, TRL) stay inside
`run`, so validating a recipe never loads them. Imports `data_curation` and `toolkit`, never
`pipeline`.
"""
