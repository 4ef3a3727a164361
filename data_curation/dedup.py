"""Duplicate prompts: exact (same normalised text) and near (MinHash LSH over word 5-gram shingles,
the `datasketch` package). The first occurrence is kept; a removed row names the row it repeats."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from data_curation.ngrams import normalize
from toolkit.core.text import question_text


def dedup(rows: Iterable[dict], near: bool = True, threshold: float = 0.8, num_perm: int = 128,
          shingle: int = 5, seed: int = 0) -> Iterator[tuple[dict, dict | None]]:
    """Yield (row, evidence or None); evidence = {reason, duplicate_of, similarity?}."""
    from datasketch import MinHash, MinHashLSH

    exact: dict[str, str] = {}
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm) if near else None
    sketches: dict[int, tuple[str, MinHash]] = {}
    for i, row in enumerate(rows):
        text = normalize(question_text(row))
        digest = hashlib.sha1(text.encode()).hexdigest()
        if digest in exact:
            yield row, {"reason": "exact_duplicate", "duplicate_of": exact[digest]}
            continue
        exact[digest] = row["id"]
        if lsh is None:
            yield row, None
            continue
        words = text.split()
        shingles = {" ".join(words[i:i + shingle]) for i in range(max(1, len(words) - shingle + 1))}
        m = MinHash(num_perm=num_perm, seed=seed)
        m.update_batch([s.encode() for s in shingles])
        matches = lsh.query(m)
        if matches:
            best = max(matches, key=lambda k: (sketches[k][1].jaccard(m), -k))  # most similar, then earliest
            yield row, {"reason": "near_duplicate", "duplicate_of": sketches[best][0],
                        "similarity": round(sketches[best][1].jaccard(m), 3)}
            continue
        lsh.insert(i, m)  # keys are positions: row ids need not be unique across sources
        sketches[i] = (row["id"], m)
        yield row, None
