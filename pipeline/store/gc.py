"""`posttrain gc`: free the disk that stage outputs no kept run needs.

The newest `keep_runs` run records are kept, and those of runs still going; every stage output
directory under $POSTTRAIN_HOME/stages/ that none of them references goes, with its checkpoints,
and so do the other run records. A directory whose stage lock a live run holds (training it, or
waiting for it) is never touched, nor is a `.partial` directory a live run is writing. A later run
that needs a removed stage simply trains it again (its cache record no longer finds the directory).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.store import runs
from pipeline.store.home import home
from pipeline.store.locks import is_held, stage_lock


@dataclass
class Plan:
    remove: list[tuple[Path, int]] = field(default_factory=list)  # (directory, bytes)
    records: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)
    busy: list[Path] = field(default_factory=list)


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def plan_gc(keep_runs: int) -> Plan:
    records = runs.all_runs()  # oldest first
    newest = {r["id"] for r in records[-keep_runs:]} if keep_runs > 0 else set()
    # A run still going keeps its record and its finished stages (a later stage may read them).
    kept = {r["id"] for r in records if r["id"] in newest or is_held(runs.run_lock(r["id"]))}
    referenced = {str(Path(s["output_dir"]).resolve()) for r in records if r["id"] in kept
                  for s in r["stages"] if s.get("output_dir")}
    plan = Plan(records=[runs.runs_dir() / f"{r['id']}.json" for r in records if r["id"] not in kept])
    for recipe_dir in sorted((home() / "stages").glob("*")):
        for out in sorted(recipe_dir.iterdir()):
            name = out.name.removesuffix(".partial")
            if is_held(stage_lock(name)):
                plan.busy.append(out)
            elif str(out.resolve()) in referenced:
                plan.kept.append(out)
            else:
                plan.remove.append((out, size_of(out)))
    return plan


def collect(keep_runs: int, dry_run: bool, echo=print) -> int:
    """Print what goes (and remove it unless `dry_run`); returns the bytes freed or to free."""
    plan = plan_gc(keep_runs)
    verb = "would remove" if dry_run else "removed"
    for path, size in plan.remove:
        if not dry_run:
            shutil.rmtree(path, ignore_errors=True)
        echo(f"{verb} {path}  ({size / 1e6:.1f} MB)")
    for record in plan.records:
        if not dry_run:
            record.unlink(missing_ok=True)
            runs.run_lock(record.stem).unlink(missing_ok=True)
        echo(f"{verb} run record {record.name}")
    for path in plan.busy:
        echo(f"kept {path}: a live run holds its lock")
    total = sum(size for _, size in plan.remove)
    echo(f"{verb} {len(plan.remove)} stage directories, {total / 1e6:.1f} MB; kept {len(plan.kept)} referenced by the "
         f"newest {keep_runs} runs" + (f", {len(plan.busy)} in use" if plan.busy else ""))
    return total
