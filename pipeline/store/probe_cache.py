"""Earnability probes that passed, kept in $POSTTRAIN_HOME/cache/ between processes.

Validation scores a correct, template-shaped answer with every accuracy reward (toolkit.rewards.
earnable); that starts a verifier pool, about 0.4 s of every `posttrain run` and `validate`. A
probe that passed passes again as long as the reward code is the same, so passes are saved per
fingerprint of that code (the module closure of toolkit.rewards.earnable). Failures are never saved.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.store.home import home
from toolkit.core.files import write_json_atomic
from toolkit.core.fingerprints import code_fingerprint
from toolkit.rewards import earnable


def cache_file() -> Path:
    return home() / "cache" / f"earnable-{code_fingerprint(('toolkit.rewards.earnable',))[:16]}.json"


@contextmanager
def remembered_probes() -> Iterator[None]:
    """Seed the probes with the saved passes; save the passes again when new ones were added."""
    path = cache_file()
    try:
        earnable.remember(json.loads(path.read_text()))
    except (OSError, ValueError):
        pass
    before = earnable.earned()
    yield
    if earnable.earned() != before:
        try:
            write_json_atomic(path, earnable.earned())
        except OSError:  # a read-only home: the probes simply run again next time
            pass
