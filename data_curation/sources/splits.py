"""Held-out splits by hashing: a row's split depends only on its key and the seed, so train and
eval never overlap, whatever `n` is asked for, and the same seed always gives the same split."""

from __future__ import annotations

import hashlib

SPLITS = ("train", "eval", "all")


def split_of(key: str, seed: int = 0, eval_share: float = 0.2) -> str:
    digest = int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:12], 16)
    return "eval" if digest / 16 ** 12 < eval_share else "train"


def in_split(key: str, split: str, seed: int = 0, eval_share: float = 0.2) -> bool:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return split == "all" or split_of(key, seed, eval_share) == split
