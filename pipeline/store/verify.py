"""Published stage outputs are checked before they are trusted again.

A stage publishes its outputs with `checksums.json`: the sha256 of every file under each output (the
model's weights, config and tokenizer; a dataset's JSONL). Whenever a run takes a published stage
instead of training it (served from the cache, or reused from another run's directory), the files
are hashed again and compared, so flipped bytes are never trained on, served or loaded by a later
stage. A corrupt output is moved aside (`<dir>.corrupt-<time>`), named in a warning, and the stage
is trained again. `posttrain verify [RUN]` checks every published output of a run, or of the home.
Cost: one read of each file per use (see benchmarks/RESULTS.md for the demo model).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.store.home import home
from toolkit.core.files import corrupt_files


def verify_stages(stages: list[dict]) -> list[str]:
    """Problems found in the published outputs of these run-record stages."""
    problems = []
    for s in stages:
        out = Path(s["output_dir"]) if s.get("output_dir") else None
        if out is None or not (out / "result.json").exists():
            continue
        problems += [f"stage {s['name']}: {bad}" for bad in corrupt_files(out)]
    return problems


def published_dirs() -> list[Path]:
    """Every published stage directory of the home (not partial ones, not those moved aside)."""
    return sorted(p.parent for p in (home() / "stages").glob("*/*/result.json")
                  if ".corrupt-" not in p.parent.name and not p.parent.name.endswith(".partial"))
