"""Mixing several datasets into one SFT set (R1 stage 3: ~600k reasoning rows from rejection
sampling with ~200k non-reasoning rows, whose simple queries carry no chain of thought).

Each part takes either an exact `count` of rows or a `weight`: a multiple of its own size (0.5 =
half its rows, 2 = each row twice), as in Tulu's dataset mixer; with neither, all of its rows.
Or every part takes a `ratio`, and the parts share the mixture in those proportions (R1's 3:1
reasoning:general is `ratio: 3` and `ratio: 1`): the mixture is as large as it can be without
repeating a row of the part that runs out first. Rows are drawn without replacement, cycling
through a seeded shuffle when a part must repeat.
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


def ratio_sizes(available: list[int], ratios: list[float]) -> list[int]:
    """Rows per part so that the parts stand in `ratios` and none repeats a row: the part with the
    fewest rows for its share sets the total."""
    total = sum(ratios)
    mixture = min(n * total / r for n, r in zip(available, ratios))
    return [max(1, int(mixture * r / total)) for r in ratios]


def mix_rows(parts: list[tuple], seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(mixed rows, composition) for parts given as (label, rows, count, weight[, ratio])."""
    rng = random.Random(seed)
    mixed, composition = [], []
    for label, rows, *_ in parts:
        if not rows:
            raise ValueError(f"mixture part {label!r} has no rows")
    ratios = [part[4] if len(part) > 4 else None for part in parts]
    if any(r is not None for r in ratios):
        sizes = ratio_sizes([len(part[1]) for part in parts], ratios)
    else:
        sizes = [part_size(len(rows), count, weight) for _, rows, count, weight, *_ in parts]
    for (label, rows, *_), size in zip(parts, sizes):
        chosen = take(rows, size, rng)
        mixed += chosen
        composition.append({"part": label, "available": len(rows), "used": len(chosen)})
    for c in composition:
        c["share"] = c["used"] / max(1, len(mixed))
    rng.shuffle(mixed)
    return mixed, composition
