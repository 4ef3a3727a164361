"""Starting processes, and making sure none outlives the run: a stage's worker (in-process, one
subprocess, DeepSpeed ranks, several nodes) in `workers.py`, the warm server that forks CPU workers
(`warm.py`), the multi-node rendezvous, the vLLM
rollout server, the temporary Prefect API, and PR_SET_PDEATHSIG helpers. Knows nothing of MLflow
(an import-linter contract: launching and tracking are independent); imports `pipeline.store`.
"""
