"""A second held-out math set, in wordings no training data uses: does a gain survive new phrasing?

Same five kinds of problem as `synthetic_math` (a sum, a product or difference, an expression
with precedence, a linear equation, a word problem), asked the way `synthetic_math` never asks
them: "Add 12 and 7.", "Compute 4 × 9.", "Evaluate 3 + 4 × 5.", "Find x when 2x + 3 = 11.", a shelf
of jars rather than a person with boxes. A model that learned only `synthetic_math`'s templates
("What is a + b?") gains there and not here. Decided once and fixed (2026-12-01): the wordings and
generator below never change, so numbers taken on it stay comparable; held-out only (`split: eval`
or `all`, which are the same rows), and no recipe trains on it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from data_curation.schema import make_row

NAME = "math_reworded"
VERIFIERS = ("math",)
SPLITS = ("eval", "all")  # held-out only: recipe validation refuses a train split
CONTAINERS = [("shelf", "jars"), ("crate", "bottles"), ("shop", "lamps"), ("library", "maps"), ("garden", "pots")]


def _sum(r: random.Random):
    a, b = r.randint(1, 49), r.randint(1, 49)
    return r.choice([f"Add {a} and {b}.", f"Find the sum of {a} and {b}.", f"Compute {a} plus {b}."]), a + b


def _product_or_difference(r: random.Random):
    a, b = r.randint(2, 12), r.randint(2, 19)
    if r.random() < 0.5:
        return r.choice([f"Compute {a} × {b}.", f"Multiply {a} by {b}.", f"Find the product of {a} and {b}."]), a * b
    big, small = a * b + r.randint(0, 30), r.randint(1, 40)
    return r.choice([f"Subtract {small} from {big}.", f"Compute {big} minus {small}.",
                     f"Take {small} away from {big}. What remains?"]), big - small


def _precedence(r: random.Random):
    a, b, c = r.randint(1, 30), r.randint(2, 9), r.randint(2, 12)
    return r.choice([f"Evaluate {a} + {b} × {c}.", f"Calculate {b} × {c} + {a}."]), a + b * c


def _equation(r: random.Random):
    a, x, b = r.randint(2, 9), r.randint(-10, 15), r.randint(-20, 20)
    c, sign = a * x + b, "+" if b >= 0 else "-"
    return r.choice([f"Find x when {a}x {sign} {abs(b)} = {c}.", f"If {a}x {sign} {abs(b)} = {c}, what is x?"]), x


def _story(r: random.Random):
    place, item = r.choice(CONTAINERS)
    start, loads, per_load, removed = r.randint(5, 40), r.randint(2, 6), r.randint(3, 12), r.randint(1, 20)
    total = start + loads * per_load - removed
    question = (f"A {place} holds {start} {item}. A delivery adds {loads} cartons of {per_load} {item} each, "
                f"and later {removed} {item} are taken out. How many {item} does the {place} hold at the end?")
    return question, total


KINDS = {1: _sum, 2: _product_or_difference, 3: _precedence, 4: _equation, 5: _story}


def rows(split: str = "eval", n: int | None = 200, seed: int = 0, difficulties: list[int] | None = None) -> Iterator[dict]:
    """Up to `n` distinct problems, cycling through the requested kinds (synthetic_math's levels)."""
    if split == "train":
        raise ValueError("math_reworded is held-out only: use split eval (or all, the same rows)")
    levels = sorted(difficulties or KINDS)
    if bad := [lv for lv in levels if lv not in KINDS]:
        raise ValueError(f"math_reworded: unknown difficulty levels {bad}; choose from {sorted(KINDS)}")
    n = 1000 if n is None else n
    seen: set[str] = set()
    index = made = 0
    while made < n and index < 50 * n + 1000:
        level = levels[index % len(levels)]
        question, answer = KINDS[level](random.Random(f"reworded:{seed}:{index}"))
        index += 1
        if question in seen:
            continue
        seen.add(question)
        yield make_row(id=f"{NAME}/{seed}/{made}", question=question, answer=str(answer), verifier="math",
                       solution=None, source=NAME, difficulty=level)  # held-out: a gold answer, no worked solution
        made += 1
