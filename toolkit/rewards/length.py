"""Length shaping: Kimi k1.5's length reward, DAPO's soft overlong punishment, cosine length scaling.

Lengths are in tokens when the caller passes `completion_ids` (TRL's GRPOTrainer and the evaluation
do); otherwise in characters, which keeps the formulas' shape but not their scale. `max_len` of
`overlong_dapo` and `cosine_length` defaults to the stage's maximum completion length.
"""

from __future__ import annotations

import math

from toolkit.rewards.base import Reward, completion_text
from toolkit.rewards.math import AccuracyMath


def _lengths(completions, completion_ids) -> list[int]:
    if completion_ids is not None:
        return [len(ids) for ids in completion_ids]
    return [len(completion_text(c)) for c in completions]


def kimi_lambda(lengths: list[int]) -> list[float]:
    """lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len); all 0 when every length is equal."""
    lo, hi = min(lengths), max(lengths)
    if hi == lo:
        return [0.0] * len(lengths)
    return [0.5 - (n - lo) / (hi - lo) for n in lengths]


def kimi_length_reward(lengths: list[int], correct: list[float | None]) -> list[float | None]:
    """Kimi k1.5: lambda if correct, min(0, lambda) if wrong, over the k samples of one prompt."""
    lams = kimi_lambda(lengths)
    return [None if c is None else (lam if c >= 1.0 else min(0.0, lam)) for lam, c in zip(lams, correct)]


def overlong_penalty(length: int, max_len: int, cache_len: int) -> float:
    """DAPO: 0 up to max_len - cache_len, then a linear ramp to -1 at max_len, -1 beyond
    (cache_len 0: a hard cutoff, -1 past max_len)."""
    soft = max_len - cache_len
    if length <= soft:
        return 0.0
    if length <= max_len:
        return (soft - length) / cache_len
    return -1.0


def cosine_scaled(length: int, correct: bool, max_len: int, min_correct: float = 0.5, max_correct: float = 1.0,
                  min_wrong: float = -1.0, max_wrong: float = -0.5) -> float:
    """Correct answers earn more when short; wrong ones are punished less when long (more effort)."""
    lo, hi = (min_correct, max_correct) if correct else (max_wrong, min_wrong)
    progress = min(length, max_len) / max_len
    return lo + 0.5 * (hi - lo) * (1.0 + math.cos(math.pi * progress))


class LengthKimi(Reward):
    """Kimi k1.5's length reward: groups the call's completions by prompt and applies the formula
    within each group. Correctness comes from `accuracy_math` with the same answer options."""
    name = "length_kimi"

    def __init__(self, answer_is_fallback: bool = True, answer_tags: bool = False, after_think: bool = False):
        super().__init__()
        self.accuracy_reward = AccuracyMath(answer_is_fallback=answer_is_fallback, answer_tags=answer_tags,
                                            after_think=after_think)
        self.counters = self.accuracy_reward.counters

    def __call__(self, prompts=None, completions=(), answer=(), completion_ids=None, **_) -> list[float | None]:
        correct = self.accuracy_reward(prompts=prompts, completions=completions, answer=answer)
        lengths = _lengths(completions, completion_ids)
        keys = [str(p) for p in prompts] if prompts is not None else [str(a) for a in answer]
        out: list[float | None] = [None] * len(completions)
        for key in dict.fromkeys(keys):
            idx = [i for i, k in enumerate(keys) if k == key]
            for i, value in zip(idx, kimi_length_reward([lengths[i] for i in idx], [correct[i] for i in idx])):
                out[i] = value
        return out


class OverlongDapo(Reward):
    """`max_len` defaults to the stage's max completion length (the paper's 20480 outside a stage),
    `cache_len` to a fifth of it (the paper's 4096 / 20480)."""
    name = "overlong_dapo"
    length_param = "max_len"

    def __init__(self, max_len: int | None = None, cache_len: int | None = None):
        super().__init__()
        max_len = 20480 if max_len is None else max_len
        cache_len = max_len // 5 if cache_len is None else cache_len
        if not (max_len >= 1 and 0 <= cache_len <= max_len):
            raise ValueError(f"overlong_dapo: need 0 <= cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
        self.max_len, self.cache_len = max_len, cache_len

    def __call__(self, prompts=None, completions=(), completion_ids=None, **_) -> list[float | None]:
        return [overlong_penalty(n, self.max_len, self.cache_len) for n in _lengths(completions, completion_ids)]

    def reachable(self, max_completion_length: int) -> str | None:
        """Why rollouts capped at `max_completion_length` could never be penalised, if they could not."""
        if self.max_len > max_completion_length:
            return (f"max_len {self.max_len} exceeds the stage's max completion length {max_completion_length}: "
                    "no rollout can reach it")
        if self.max_len - self.cache_len >= max_completion_length:
            return f"no rollout can pass max_len - cache_len = {self.max_len - self.cache_len}: the penalty never applies"
        return None


class CosineLength(Reward):
    """Correctness comes from `accuracy_math` with the same answer options as the stage's accuracy
    reward (`answer_tags`, `after_think`): a length reward that judged correctness elsewhere would
    pay for a right answer where the template does not read it (validation probes this)."""
    name = "cosine_length"
    length_param = "max_len"

    def __init__(self, max_len: int | None = None, min_correct: float = 0.5, max_correct: float = 1.0,
                 min_wrong: float = -1.0, max_wrong: float = -0.5, answer_is_fallback: bool = True,
                 answer_tags: bool = False, after_think: bool = False):
        super().__init__()
        max_len = 1000 if max_len is None else max_len  # the stage's max completion length inside a stage
        if max_len < 1:
            raise ValueError(f"cosine_length: max_len must be >= 1, got {max_len}")
        self.max_len, self.bounds = max_len, (min_correct, max_correct, min_wrong, max_wrong)
        self.accuracy_reward = AccuracyMath(answer_is_fallback=answer_is_fallback, answer_tags=answer_tags,
                                            after_think=after_think)
        self.counters = self.accuracy_reward.counters

    def __call__(self, prompts=None, completions=(), answer=(), completion_ids=None, **_) -> list[float | None]:
        correct = self.accuracy_reward(prompts=prompts, completions=completions, answer=answer)
        return [None if c is None else cosine_scaled(n, c >= 1.0, self.max_len, *self.bounds)
                for n, c in zip(_lengths(completions, completion_ids), correct)]


class Repetition(Reward):
    """Penalty proportional to the share of repeated n-grams: 0 for none, max_penalty for all.
    N-grams of tokens when `completion_ids` are passed (text without spaces too), else of words."""
    name = "repetition"

    def __init__(self, ngram: int = 3, max_penalty: float = -1.0):
        super().__init__()
        if max_penalty > 0:
            raise ValueError("repetition: max_penalty must be <= 0")
        if ngram < 1:
            raise ValueError("repetition: ngram must be >= 1")
        self.ngram, self.max_penalty = ngram, max_penalty

    def score(self, units: list) -> float:
        grams = [tuple(units[i:i + self.ngram]) for i in range(len(units) - self.ngram + 1)]
        if not grams:
            return 0.0
        return (1.0 - len(set(grams)) / len(grams)) * self.max_penalty + 0.0  # + 0.0 turns -0.0 into 0.0

    def __call__(self, prompts=None, completions=(), completion_ids=None, **_) -> list[float | None]:
        if completion_ids is not None:
            return [self.score(list(ids)) for ids in completion_ids]
        return [self.score(completion_text(c).lower().split()) for c in completions]
