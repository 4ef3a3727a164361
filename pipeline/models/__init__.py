"""Models by name: the tiny random models and the demo's SmolLM2 that posttrain builds locally
(`builds.py`), how any model reference in a recipe becomes a directory with a checksum
(`named.py`), and the tokenizer checks validation runs. Imports `pipeline.tracking` (a model's
checksum is the one MLflow records) and `pipeline.store`.
"""
