"""File locks in $POSTTRAIN_HOME/locks/. The OS releases a lock when its holder dies (flock), so a
lock left by a killed run never blocks the next one; the holder's pid is written in the file only
to say who holds it."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.store.home import home


def lock_path(*parts: str) -> Path:
    path = home() / "locks" / Path(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(path.name + ".lock")


@contextmanager
def held(path: Path, on_wait: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Hold the lock at `path`; yields True when another process held it first and we waited."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    waited = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            if on_wait:
                on_wait(os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield waited
    finally:
        os.close(fd)  # closing releases the lock


def stage_lock(output_name: str) -> Path:
    """The lock of one stage output (`<stage>-<key>`), across recipes: the key is the content of the
    work, so two recipes with the same stage train it once, and its single writer holds this."""
    return lock_path("stages", output_name)


def model_lock(output_name: str) -> Path:
    """Held while a stage output is logged as an MLflow model, so two runs log one model per output."""
    return lock_path("logged-models", output_name)


def is_held(path: Path) -> bool:
    """Whether a live process holds the lock at `path` (a missing file is not held)."""
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
