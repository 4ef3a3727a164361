"""Length shaping: Kimi k1.5's length reward, DAPO's soft overlong punishment, cosine length scaling.

Lengths are in tokens when the trainer passes `completion_ids` (TRL's GRPOTrainer does); otherwise
in characters, which keeps the formulas' shape but not their scale.
"""

from __future__ import annotations

import math


def _lengths(completions, completion_ids) -> list[int]:
    from stages.rewards import completion_text

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
    """DAPO: 0 up to max_len - cache_len, then a linear ramp to -1 at max_len, -1 beyond."""
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


def length_kimi(answer_is_fallback: bool = True):
    """Groups the call's completions by prompt and applies the Kimi formula within each group."""
    from stages.rewards.math import accuracy_math

    accuracy = accuracy_math(answer_is_fallback=answer_is_fallback)

    def reward(prompts=None, completions=(), answer=(), completion_ids=None, **_):
        correct = accuracy(prompts=prompts, completions=completions, answer=answer)
        lengths = _lengths(completions, completion_ids)
        keys = [str(p) for p in prompts] if prompts is not None else [str(a) for a in answer]
        out: list[float | None] = [None] * len(completions)
        for key in dict.fromkeys(keys):
            idx = [i for i, k in enumerate(keys) if k == key]
            for i, value in zip(idx, kimi_length_reward([lengths[i] for i in idx], [correct[i] for i in idx])):
                out[i] = value
        return out
    return reward


def overlong_dapo(max_len: int = 20480, cache_len: int = 4096):
    if not 0 < cache_len <= max_len:
        raise ValueError(f"overlong_dapo: need 0 < cache_len <= max_len, got {cache_len}, {max_len}")

    def reward(prompts=None, completions=(), completion_ids=None, **_):
        return [overlong_penalty(n, max_len, cache_len) for n in _lengths(completions, completion_ids)]
    return reward


def cosine_length(max_len: int = 1000, min_correct: float = 0.5, max_correct: float = 1.0,
                  min_wrong: float = -1.0, max_wrong: float = -0.5):
    from stages.rewards.math import accuracy_math

    accuracy = accuracy_math()

    def reward(prompts=None, completions=(), answer=(), completion_ids=None, **_):
        correct = accuracy(prompts=prompts, completions=completions, answer=answer)
        return [None if c is None else cosine_scaled(n, c >= 1.0, max_len, min_correct, max_correct, min_wrong, max_wrong)
                for n, c in zip(_lengths(completions, completion_ids), correct)]
    return reward


def repetition(ngram: int = 3, max_penalty: float = -1.0):
    """Penalty proportional to the share of repeated word n-grams: 0 for none, max_penalty for all."""
    from stages.rewards import completion_text

    if max_penalty > 0:
        raise ValueError("repetition: max_penalty must be <= 0")

    def score(text: str) -> float:
        words = text.lower().split()
        grams = [tuple(words[i:i + ngram]) for i in range(len(words) - ngram + 1)]
        if not grams:
            return 0.0
        return (1.0 - len(set(grams)) / len(grams)) * max_penalty

    def reward(prompts=None, completions=(), **_):
        return [score(completion_text(c)) for c in completions]
    return reward
