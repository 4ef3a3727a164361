"""MLflow: every run, metric, table, figure and logged model posttrain writes there. `mlflow_runs.py`
is the only writer of runs (the flow's pipeline and stage runs, a worker's step metrics with their
spool); `logged_models.py` files models and datasets and moves registry aliases. Imports
`pipeline.store` only; knows nothing of launching.
"""
