"""Mixing several datasets into one SFT set (R1 stage 3: ~600k reasoning rows from rejection
sampling with ~200k non-reasoning rows, whose simple queries carry no chain of thought).

Each part takes either an exact `count` of rows or a `weight`: a multiple of its own size (0.5 =
half its rows, 2 = each row twice), as in Tulu's dataset mixer; with neither, all of its rows.
Rows are drawn without replacement, cycling through a seeded shuffle when a part must repeat.
"""

from __future__ import annotations

import random


def part_size(available: int, count: int | None, weight: float | None) -> int:
    if count is not None:
        return count
    return round(available * weight) if weight is not None else available


def take(rows: list[dict], size: int, rng: random.Random) -> list[dict]:
    """`size` rows: whole seeded shuffles of `rows`, then part of one more."""
    if not rows:
        return []
    out: list[dict] = []
    while len(out) < size:
        cycle = list(rows)
        rng.shuffle(cycle)
        out += cycle[:size - len(out)]
    return out


def mix_rows(parts: list[tuple[str, list[dict], int | None, float | None]], seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(mixed rows, composition) for parts given as (label, rows, count, weight)."""
    rng = random.Random(seed)
    mixed, composition = [], []
    for label, rows, count, weight in parts:
        if not rows:
            raise ValueError(f"mixture part {label!r} has no rows")
        chosen = take(rows, part_size(len(rows), count, weight), rng)
        mixed += chosen
        composition.append({"part": label, "available": len(rows), "used": len(chosen)})
    for c in composition:
        c["share"] = c["used"] / max(1, len(mixed))
    rng.shuffle(mixed)
    return mixed, composition
