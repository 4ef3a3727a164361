"""How sure a held-out number is, and whether a change between two models on the same prompts is
real. Pure functions, standard library only.

- rates (accuracy, format, constraint pass): the Wilson score interval, which stays inside [0, 1]
  and keeps its coverage at small n and at rates near 0 or 1, where the normal interval does not;
- means (lengths, reward-model scores): a percentile bootstrap;
- a change between two models scored on the same prompts: for 0/1 scores, Newcombe's hybrid score
  interval for paired proportions (Newcombe 1998, method 10) and McNemar's exact test (a two-sided
  binomial test on the discordant pairs); for other scores a paired bootstrap of the mean
  difference (resampling prompts, both models together). The bootstrap is not used for 0/1 pairs:
  with a handful of discordant pairs its percentile interval is too narrow (4 lost, 0 gained of 200
  gave [-0.040, -0.005], "significant", where McNemar's p is 0.125);
- sampled evaluation: the unbiased pass@k estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k).

Bootstraps use a fixed seed, so a number and its interval are reproducible.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

Z95 = 1.959963984540054
# what printed tables say of their intervals
INTERVALS = "[lo, hi]: 95% interval (Wilson for rates, bootstrap for means, Newcombe for paired 0/1 changes, " \
            "paired bootstrap for other changes)"
BOOTSTRAP_ITERATIONS = 2000


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a rate; (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # at 0 (or n) successes the bound is exactly 0 (or 1); floating point leaves 1e-17
    return (0.0 if successes <= 0 else max(0.0, centre - half)), (1.0 if successes >= n else min(1.0, centre + half))


def _percentiles(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    last = len(values) - 1
    return values[round(0.025 * last)], values[round(0.975 * last)]


def bootstrap_mean(values: Sequence[float], iterations: int = BOOTSTRAP_ITERATIONS, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of a mean; a single value's interval is itself."""
    values = list(values)
    if len(values) < 2:
        return (values[0], values[0]) if values else (0.0, 0.0)
    rng, n = random.Random(seed), len(values)
    return _percentiles([sum(rng.choices(values, k=n)) / n for _ in range(iterations)])


def rate_interval(scores: Sequence[float | None]) -> dict[str, float]:
    """mean, lo, hi and n of judged 0/1 (or fractional) scores; None scores are left out."""
    judged = [s for s in scores if s is not None]
    n = len(judged)
    mean = sum(judged) / n if n else 0.0
    if all(s in (0.0, 1.0) for s in judged):
        lo, hi = wilson(sum(judged), n)
    else:  # partial credit (a share of tests passed): the mean of fractions
        lo, hi = bootstrap_mean(judged)
    return {"mean": mean, "lo": lo, "hi": hi, "n": float(n)}


def mean_interval(values: Sequence[float | None]) -> dict[str, float]:
    judged = [v for v in values if v is not None]
    mean = sum(judged) / len(judged) if judged else 0.0
    lo, hi = bootstrap_mean(judged)
    return {"mean": mean, "lo": lo, "hi": hi, "n": float(len(judged))}


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided p-value of McNemar's exact test: b pairs right only under model A, c only under B."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def newcombe_paired(both: int, lost: int, gained: int, neither: int, z: float = Z95) -> tuple[float, float]:
    """95% interval of p_after - p_before from a paired 2x2 table (Newcombe 1998, method 10: the
    two rates' Wilson intervals, combined with the pairs' phi correlation). `lost`: right before
    only; `gained`: right after only."""
    n = both + lost + gained + neither
    if n == 0:
        return 0.0, 0.0
    p1, p2 = (both + lost) / n, (both + gained) / n
    l1, u1 = wilson(both + lost, n, z)
    l2, u2 = wilson(both + gained, n, z)
    margins = (both + lost) * (gained + neither) * (both + gained) * (lost + neither)
    phi = (both * neither - lost * gained) / math.sqrt(margins) if margins else 0.0
    delta = p2 - p1
    below = math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    above = math.sqrt(max(0.0, (u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2))
    return max(-1.0, delta - below), min(1.0, delta + above)


def paired_change(before: Sequence[float | None], after: Sequence[float | None],
                  iterations: int = BOOTSTRAP_ITERATIONS, seed: int = 0) -> dict[str, float]:
    """after - before on the same prompts (pairs where either is None are left out): the mean
    difference, its 95% interval (Newcombe's for 0/1 scores, else a paired bootstrap), n, and for
    0/1 scores McNemar's p-value."""
    pairs = [(a, b) for a, b in zip(before, after) if a is not None and b is not None]
    n = len(pairs)
    diffs = [b - a for a, b in pairs]
    out = {"delta": sum(diffs) / n if n else 0.0, "n": float(n)}
    if n and all(a in (0.0, 1.0) and b in (0.0, 1.0) for a, b in pairs):
        table = Counter(pairs)
        both, lost, gained, neither = table[1.0, 1.0], table[1.0, 0.0], table[0.0, 1.0], table[0.0, 0.0]
        out["lo"], out["hi"] = newcombe_paired(both, lost, gained, neither)
        out["p"] = mcnemar_exact(gained, lost)
    else:
        out["lo"], out["hi"] = bootstrap_mean(diffs, iterations, seed) if n else (0.0, 0.0)
    return out


def significant(change: dict[str, float]) -> bool:
    """Whether a paired change's 95% interval excludes 0."""
    return change["lo"] > 0 or change["hi"] < 0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021): the chance that at least one of k of the n samples (c of them correct) is."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def majority_correct(answers: Sequence[str | None], correct: Sequence[float | None]) -> float | None:
    """maj@k: 1 when the most common extracted answer among the samples is a correct one (ties go
    to the answer seen first); None when no sample has an answer."""
    seen = [(a, c) for a, c in zip(answers, correct) if a is not None]
    if not seen:
        return None
    top = Counter(a for a, _ in seen).most_common(1)[0][0]
    return float(next(c for a, c in seen if a == top) == 1.0)
