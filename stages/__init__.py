"""Everything below the orchestrator, in layers that import downwards only (pyproject.toml's
import-linter contract): `kinds` (stage kinds) > `data_curation` > `rewards` | `rollouts` > `core`."""
