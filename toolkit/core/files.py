"""Files written so that a crash never leaves half of one, and content fingerprints of files and
model directories (part of every cache key)."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path


def write_json_atomic(path: Path, data) -> None:
    """Write `data` as JSON to a temporary file beside `path`, then rename it into place. A write that
    fails (a full disk, data that is not JSON) leaves `path` as it was and removes its temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def publish_dir(final: Path, marker: str, build) -> Path:
    """`final`, made by `build(path)` into a temp folder beside it and renamed into place, unless it is
    there already (`final / marker` exists). Two processes building at once both end with a whole one;
    a failed build leaves nothing behind."""
    if (final / marker).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(tmp / "out")
        try:
            (tmp / "out").rename(final)
        except OSError:  # another process published it first
            if not (final / marker).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


_TEMP_DIRS: dict[str, Path] = {}


def process_temp_dir(prefix: str) -> Path:
    """One temp folder per prefix for this process, removed when it exits: for what is too big to
    leave behind per call (a model's conversion, where no home's cache was configured)."""
    if prefix not in _TEMP_DIRS:
        _TEMP_DIRS[prefix] = Path(tempfile.mkdtemp(prefix=prefix))
        atexit.register(shutil.rmtree, _TEMP_DIRS[prefix], True)
    return _TEMP_DIRS[prefix]


def publish_kept(final: Path, marker: str, build, kept: int) -> Path:
    """publish_dir for a cache of conversions: `final` is marked as just used (its mtime), and the
    least recently used of its siblings beyond `kept` are dropped (prune_least_recent)."""
    if (final / marker).exists():
        os.utime(final)
        return final
    publish_dir(final, marker, build)
    prune_least_recent(final.parent, keep=final, kept=kept)
    return final


def prune_least_recent(root: Path, keep: Path, kept: int) -> None:
    """Drop the least recently used folders in `root` beyond `kept`, never `keep` (the one just made
    or used) nor a hidden one (a build in progress). Made for model conversions: each is the model's
    size again (0.5 GB for SmolLM2 in float32), and one still wanted is made again in seconds; one a
    process has open stays readable (it is mapped)."""
    done = sorted((d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".") and d != keep),
                  key=lambda d: d.stat().st_mtime, reverse=True)
    for old in done[kept - 1:]:
        shutil.rmtree(old, ignore_errors=True)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _weight_files(path: Path, pattern: str = "*.safetensors") -> list[Path]:
    """The files dir_fingerprint hashes: the weight files, or every file when there are none."""
    return sorted(path.glob(pattern)) or sorted(p for p in path.rglob("*") if p.is_file())


def dir_fingerprint(path: Path, pattern: str = "*.safetensors") -> str:
    """Content hash of the weight files of a model directory (names and bytes), or of one file."""
    if Path(path).is_file():
        return sha256_file(Path(path))
    h = hashlib.sha256()
    for f in _weight_files(Path(path), pattern):
        h.update(f.name.encode())
        h.update(sha256_file(f).encode())
    return h.hexdigest()


_FINGERPRINTS: dict[tuple, str] = {}


def weights_fingerprint(path: Path) -> str:
    """dir_fingerprint of a model's weights, hashed once per process while its files keep their
    names, sizes and modification times: a generation engine looks its conversion up by it at every
    open, and hashing SmolLM2's 0.5 GB takes about a second. For cache keys only: checks that
    bytes are intact (manifests, the registry) hash them every time."""
    files = _weight_files(Path(path)) if Path(path).is_dir() else [Path(path)]
    key = (str(Path(path).resolve()), *((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key not in _FINGERPRINTS:
        _FINGERPRINTS[key] = dir_fingerprint(Path(path))
    return _FINGERPRINTS[key]


MANIFEST = "checksums.json"


def _files(root: Path, rel: str) -> list[Path]:
    path = root / rel
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name != MANIFEST) if path.is_dir() else [path]


def write_manifest(out_dir: Path, outputs: dict[str, str] | None = None) -> None:
    """Record the sha256 of every file of every output (or of the whole directory), so a later
    reader can tell flipped, truncated or missing bytes from what was written."""
    rels = list((outputs or {".": "."}).values())
    sums = {str(f.relative_to(out_dir)): sha256_file(f) for rel in rels for f in _files(out_dir, rel)}
    write_json_atomic(out_dir / MANIFEST, sums)


def corrupt_files(out_dir: Path) -> list[str]:
    """The files under `out_dir` that are missing or differ from its manifest (none when it has no
    manifest: nothing to compare with)."""
    manifest = out_dir / MANIFEST
    if not manifest.exists():
        return []
    bad = []
    for rel, digest in json.loads(manifest.read_text()).items():
        path = out_dir / rel
        if not path.is_file():
            bad.append(f"{path} (missing)")
        elif sha256_file(path) != digest:
            bad.append(f"{path} (sha256 differs from the one recorded when it was written)")
    return bad


def quarantine(path: Path) -> Path:
    """Move a corrupt directory (a published output, a checkpoint) aside as `<name>.corrupt-<time>`:
    kept for a look, never taken again."""
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    path.rename(aside)
    return aside


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    """Save a matplotlib figure to a temporary name, rename it into place and close it."""
    import matplotlib.pyplot as plt

    tmp = path.with_name(path.stem + ".tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    os.replace(tmp, path)
