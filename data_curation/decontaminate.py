"""Decontamination: drop training rows that share word n-grams with evaluation items.

Two rules (n = 8 by default, text normalised by lowercasing and collapsing whitespace):
- `any` (open-r1, s1): a row is flagged when any of its n-grams occurs in any eval item.
- `coverage` (Tulu 3): a row is flagged when more than `threshold` of one eval item's tokens
  (words) lie inside n-grams the row shares with it.
The eval side is held in memory (its texts and a sorted array of n-gram hashes with their owners);
the training side streams through in chunks whose n-grams are hashed in bulk
(data_curation.ngrams). Hash hits are confirmed on the exact n-grams of the eval items they point
at, so the flagged rows are exactly those a plain set-of-tuples implementation flags.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Literal

import numpy as np

from data_curation.ngrams import HashSet, chunk_hits, chunk_ngram_hashes, word_ngrams
from toolkit.core.text import question_text

Mode = Literal["any", "coverage"]


@dataclass
class EvalIndex:
    n: int
    ids: list[str]
    texts: list[str]
    hashes: np.ndarray  # every eval n-gram hash, sorted
    owner: np.ndarray  # hashes[i] comes from eval item owner[i]
    members: HashSet
    _grams: dict[int, tuple[list[tuple], set[tuple]]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.ids)

    def _item(self, item: int) -> tuple[list[tuple], set[tuple]]:
        """An eval item's n-grams in order and as a set, computed when a training row first touches it."""
        if item not in self._grams:
            grams = word_ngrams(self.texts[item], self.n)
            self._grams[item] = (grams, set(grams))
        return self._grams[item]

    def positional_grams(self, item: int) -> list[tuple]:
        """Gram j covers words j .. j+n-1."""
        return self._item(item)[0]

    def grams(self, item: int) -> set[tuple]:
        return self._item(item)[1]

    def owners(self, hashes: np.ndarray) -> list[int]:
        lo, hi = np.searchsorted(self.hashes, hashes, "left"), np.searchsorted(self.hashes, hashes, "right")
        return sorted({int(i) for a, b in zip(lo, hi) for i in self.owner[a:b]})


def build_index(eval_rows: Iterable[dict], n: int = 8) -> EvalIndex:
    rows = list(eval_rows)
    texts = [question_text(r) for r in rows]
    hashes, owner = chunk_ngram_hashes(texts, n)
    order = np.argsort(hashes, kind="stable")
    return EvalIndex(n=n, ids=[r["id"] for r in rows], texts=texts, hashes=hashes[order], owner=owner[order],
                     members=HashSet(hashes))


def _candidates(texts: list[str], index: EvalIndex) -> dict[int, np.ndarray]:
    """Texts with at least one n-gram hash found on the eval side, with those hashes."""
    rows, hashes = chunk_hits(texts, index.n, index.members)
    out: dict[int, list] = {}
    for row, h in zip(rows.tolist(), hashes):
        out.setdefault(row, []).append(h)
    return {row: np.unique(np.array(hs, dtype=np.uint64)) for row, hs in out.items()}


def token_coverage(item_grams: list[tuple], shared: set[tuple], n: int) -> float:
    """Share of an eval item's words that lie inside at least one of its n-grams found in `shared`."""
    words = len(item_grams) + n - 1
    covered = [False] * words
    for j, gram in enumerate(item_grams):
        if gram in shared:
            covered[j:j + n] = [True] * n
    return sum(covered) / words


def contamination_evidence(text: str, hit_hashes: np.ndarray, index: EvalIndex, mode: Mode, threshold: float) -> dict | None:
    """Evidence ({eval_id, ngram, coverage}) when the row is contaminated, else None; confirmed on
    the exact n-grams of the eval items its hashes point at."""
    grams = set(word_ngrams(text, index.n))
    best = None
    for item in index.owners(hit_hashes):
        shared = grams & index.grams(item)
        if not shared:
            continue  # a hash collision
        if mode == "any":
            return {"eval_id": index.ids[item], "ngram": " ".join(min(shared)), "coverage": None}
        share = token_coverage(index.positional_grams(item), shared, index.n)
        if share > threshold and (best is None or share > best["coverage"]):
            best = {"eval_id": index.ids[item], "ngram": " ".join(min(shared)), "coverage": share}
    return best


def decontaminate(rows: Iterable[dict], index: EvalIndex, mode: Mode = "any", threshold: float = 0.5,
                  chunk: int = 4096) -> Iterator[tuple[dict, dict | None]]:
    """Yield (row, evidence or None) for every training row, streaming in chunks."""
    it = iter(rows)
    while batch := list(islice(it, chunk)):
        texts = [r["prompt"][-1]["content"] for r in batch]  # question_text, inlined: this loop is hot
        hits = _candidates(texts, index)
        if not hits:
            yield from zip(batch, [None] * len(batch))
            continue
        for i, row in enumerate(batch):
            yield row, (contamination_evidence(texts[i], hits[i], index, mode, threshold) if i in hits else None)
