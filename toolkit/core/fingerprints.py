"""Code fingerprints: the hash of a module's source and of every project module it imports,
transitively (function-local imports included, found by reading the source, not by running it).
A stage's cache key contains it, so editing any module a stage kind uses changes the key, and no
hand-kept list of files can forget one."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
from functools import cache
from pathlib import Path

from toolkit.core.files import write_json_atomic

PROJECT_PACKAGES = ("stages", "pipeline", "data_curation", "toolkit")
_scan_dir: Path | None = None


def keep_import_scans_in(directory: Path | None) -> None:
    """Keep each file's import scan in `directory`, named by the hash of its source, so that a new
    process reads it instead of parsing the file again (parsing a stage kind's closure is about
    0.15 s of every run's start-up)."""
    global _scan_dir
    _scan_dir = directory


def _source_file(module: str, root: Path) -> Path | None:
    """The file of a project module below `root`, or None when `module` is not a project module."""
    parts = module.split(".")
    if parts[0] not in PROJECT_PACKAGES:
        return None
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _imports(path: Path, module: str) -> frozenset[str]:
    """Every module named by an import statement in `path`, anywhere in the file; `from a import b`
    counts as both `a` and `a.b` (b may be a submodule)."""
    source = path.read_bytes()
    saved = None
    if _scan_dir is not None:
        saved = _scan_dir / (hashlib.sha256(module.encode() + b"\0" + source).hexdigest()[:32] + ".json")
        try:
            return frozenset(json.loads(saved.read_text()))
        except (OSError, ValueError):  # not scanned yet
            pass
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    if saved is not None:
        try:
            write_json_atomic(saved, sorted(found))
        except OSError:  # a read-only home: scan again next time
            pass
    return frozenset(found)


def module_closure(roots: tuple[str, ...], root: Path) -> list[Path]:
    """The source files of `roots` and of every project module they import, transitively, with
    the `__init__.py` of each package on the way."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        module = todo.pop()
        names = [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)]  # parents too
        for name in names:
            if name in seen:
                continue
            path = _source_file(name, root)
            if path is None:
                continue
            seen[name] = path
            todo.extend(_imports(path, name))
    return sorted(seen.values())


@cache
def code_fingerprint(roots: tuple[str, ...], root: Path = Path(__file__).resolve().parents[2]) -> str:
    h = hashlib.sha256()
    for path in module_closure(roots, root):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
