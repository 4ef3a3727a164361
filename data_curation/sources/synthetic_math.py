"""Procedural math problems with worked, step-by-step solutions and gold answers.

Five difficulty levels, from one addition to multi-step word problems and linear equations. Each
solution is long-CoT shaped: reasoning inside <think>...</think>, then a short summary with the
answer in \\boxed{}. Everything is a pure function of (seed, index), so the data is reproducible.

The train/eval split is decided by a hash of the question text with `split_seed` (not `seed`, which
drives generation), so no question can ever sit in both splits, whatever seeds and sizes are asked
for, and a different `split_seed` gives a different held-out set.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from data_curation.schema import make_row
from toolkit.core.thinking import rechecked, thinking_response

NAME = "synthetic_math"
VERIFIERS = ("math",)  # what its rows are judged by (recipe validation reasons with it)
EVAL_SHARE = 10  # one question in EVAL_SHARE goes to the eval split
NAMES = ["Ada", "Ben", "Chen", "Dana", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Jo"]
ITEMS = ["apples", "books", "coins", "marbles", "pencils", "stamps"]


def _level1(r: random.Random):
    a, b = r.randint(1, 49), r.randint(1, 49)
    return f"What is {a} + {b}?", a + b, [f"I need to add {a} and {b}.", f"{a} + {b} = {a + b}."]


def _level2(r: random.Random):
    a, b = r.randint(2, 12), r.randint(2, 19)
    if r.random() < 0.5:
        return f"What is {a} * {b}?", a * b, [f"I need to multiply {a} by {b}.", f"{a} * {b} = {a * b}."]
    big, small = a * b + r.randint(0, 30), r.randint(1, 40)
    return (f"What is {big} - {small}?", big - small,
            [f"I need to subtract {small} from {big}.", f"{big} - {small} = {big - small}."])


def _level3(r: random.Random):
    a, b, c = r.randint(1, 30), r.randint(2, 9), r.randint(2, 12)
    return (f"What is {a} + {b} * {c}?", a + b * c,
            ["Multiplication comes before addition.", f"First, {b} * {c} = {b * c}.",
             f"Then, {a} + {b * c} = {a + b * c}."])


def _level4(r: random.Random):
    a, x, b = r.randint(2, 9), r.randint(-10, 15), r.randint(-20, 20)
    c = a * x + b
    sign = "+" if b >= 0 else "-"
    steps = [f"The equation is {a}x {sign} {abs(b)} = {c}.",
             f"Move the constant: {a}x = {c} {'-' if b >= 0 else '+'} {abs(b)} = {c - b}.",
             f"Divide by {a}: x = {c - b} / {a} = {x}.",
             f"Check: {a} * {x} {sign} {abs(b)} = {a * x + b}, which matches."]
    return f"Solve for x: {a}x {sign} {abs(b)} = {c}.", x, steps


def _level5(r: random.Random):
    name, item = r.choice(NAMES), r.choice(ITEMS)
    start, boxes, per_box, given = r.randint(5, 40), r.randint(2, 6), r.randint(3, 12), r.randint(1, 20)
    total = start + boxes * per_box - given
    q = (f"{name} has {start} {item}. {name} buys {boxes} boxes with {per_box} {item} in each box, "
         f"then gives {given} {item} to a friend. How many {item} does {name} have now?")
    steps = [f"{name} starts with {start} {item}.",
             f"The boxes hold {boxes} * {per_box} = {boxes * per_box} {item}.",
             f"After buying: {start} + {boxes * per_box} = {start + boxes * per_box}.",
             f"After giving {given} away: {start + boxes * per_box} - {given} = {total}."]
    return q, total, steps


LEVELS = {1: _level1, 2: _level2, 3: _level3, 4: _level4, 5: _level5}


def split_of(question: str, split_seed: int = 0) -> str:
    """The split hashes the question with `split_seed`, not with `seed`: `seed` picks which problems
    are generated, so two seeds that differ still agree on every question's split."""
    key = question if split_seed == 0 else f"{split_seed}:{question}"  # 0 keeps the published split
    digest = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return "eval" if digest % EVAL_SHARE == 0 else "train"


def solution_text(steps: list[str], answer: int, rechecks: int = 0) -> str:
    return thinking_response(rechecked("\n".join(steps), rechecks), f"The answer is \\boxed{{{answer}}}.")


def param_problems(difficulties=None, rechecks=0, **_) -> list[tuple[str, str]]:
    """(parameter, message) for values `rows` would refuse; recipe validation asks before any compute."""
    problems = []
    if difficulties is not None and (not isinstance(difficulties, (list, tuple))
                                     or any(type(lv) is not int or lv not in LEVELS for lv in difficulties)):
        problems.append(("difficulties", f"difficulties must be a list of levels from {sorted(LEVELS)}, "
                                         f"not {difficulties!r}"))
    def count(x):
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 8

    spread = isinstance(rechecks, (list, tuple)) and len(rechecks) == 2 and all(map(count, rechecks)) \
        and rechecks[0] <= rechecks[1]
    if not (count(rechecks) or spread):
        problems.append(("rechecks", f"rechecks must be a whole number from 0 to 8, or [low, high] of two such "
                                     f"numbers with low <= high, not {rechecks!r}"))
    return problems


def rows(split: str = "train", n: int | None = 256, seed: int = 0,
         difficulties: list[int] | None = None, split_seed: int = 0,
         rechecks: int | list[int] = 0) -> Iterator[dict]:
    """Yield up to `n` distinct problems of `split`, cycling through the requested levels. With
    `rechecks`, each solution's thinking goes over its steps that many more times ("Let me check that
    again."): long thinking for a long-CoT warm-up, the same questions, answers and final line.
    `rechecks: [low, high]` draws each row's count uniformly (seeded by the row): a long thinker whose
    samples vary in length, as long2short's sampled pairs need."""
    problems = param_problems(difficulties=difficulties, rechecks=rechecks)
    if problems:
        raise ValueError(f"synthetic_math: {problems[0][1]}")
    levels = sorted(difficulties or LEVELS)
    if n is None:
        n = 1000
    seen: set[str] = set()
    index, made, misses = 0, 0, 0
    while made < n:
        level = levels[index % len(levels)]
        r = random.Random(f"{seed}:{index}")
        index += 1
        question, answer, steps = LEVELS[level](r)
        times = rechecks if isinstance(rechecks, int) else r.randint(*rechecks)  # drawn after the question
        if question in seen or split not in ("all", split_of(question, split_seed)):
            misses += 1
            if misses > 50 * n + 1000:  # a tiny level cannot supply n distinct questions
                return
            continue
        seen.add(question)
        yield make_row(id=f"{NAME}/{split}/{seed}/{made}", question=question, answer=str(answer),
                       verifier="math", solution=solution_text(steps, answer, times), source=NAME,
                       difficulty=level)
        made += 1
