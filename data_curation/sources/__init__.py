"""Named data sources. A recipe names one (`data: {source: synthetic_math, n: 512}`) and the
registry turns that into rows of the common schema (`data_curation.schema`)."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Iterator

from data_curation.sources import synthetic_math

SOURCES: dict[str, Callable[..., Iterator[dict]]] = {
    synthetic_math.NAME: synthetic_math.rows,
}


def source_params(name: str) -> set[str]:
    return set(inspect.signature(SOURCES[name]).parameters)


def load_rows(source: str, split: str = "train", n: int | None = None, seed: int = 0,
              params: dict | None = None) -> list[dict]:
    if source not in SOURCES:
        raise KeyError(f"unknown data source {source!r}; known: {sorted(SOURCES)}")
    return list(SOURCES[source](split=split, n=n, seed=seed, **(params or {})))


def source_fingerprint(source: str) -> str:
    """Hash of the source's code: data made by a changed generator gets a new cache key."""
    module = inspect.getmodule(SOURCES[source])
    return hashlib.sha256(inspect.getsource(module).encode()).hexdigest()[:16]



def check_data_spec(source: str, params: dict) -> list[tuple[tuple, str]]:
    """Problems with a named-source data spec, as (relative YAML path, message); loads nothing."""
    if source not in SOURCES:
        return [(("source",), f"unknown data source {source!r}; known: {', '.join(sorted(SOURCES))}")]
    accepted = source_params(source) - {"split", "n", "seed"}
    return [(("params", k), f"{source} takes no parameter {k!r}; it takes {sorted(accepted)}")
            for k in params if k not in accepted]
