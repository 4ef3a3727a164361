"""Word n-grams, hashed in bulk with numpy.

Text is normalised as `" ".join(text.lower().split())` (lowercase, whitespace collapsed). A chunk
of texts becomes one UTF-8 byte buffer; word boundaries, word hashes and n-gram hashes are then
array operations (polynomial hashes mod 2^64 from prefix sums), so no Python code runs per word or
per n-gram. Hashes can collide, so callers confirm every hit on the exact words; results are then
identical to comparing n-gram tuples.
"""

from __future__ import annotations

import re

import numpy as np

WORD_BASE = 1_000_003
GRAM_BASE = 0x9E3779B97F4A7C15
_ASCII_SPACE = np.zeros(256, dtype=bool)
_ASCII_SPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True  # what str.split() splits ASCII on


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def word_ngrams(text: str, n: int) -> list[tuple[str, ...]]:
    words = normalize(text).split()
    return list(zip(*(words[i:] for i in range(n))))


# Every non-ASCII character str.split() treats as whitespace (tests check this list against
# str.isspace); a byte-level scan would not see them, so they become spaces first.
UNICODE_SPACE = re.compile("[\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")


class _Powers:
    """base^j and base^-j modulo 2^bits for j < size, grown on demand and reused across chunks."""

    def __init__(self, base: int, dtype):
        self.dtype, self.bits = dtype, np.dtype(dtype).itemsize * 8
        self.base, self.inverse = base % (1 << self.bits), pow(base, -1, 1 << self.bits)
        self.fwd = self.inv = np.ones(1, dtype=dtype)

    def _table(self, base: int, size: int) -> np.ndarray:
        """[base^0, ..., base^(size-1)] by doubling: each step multiplies the filled prefix by
        base^filled (log2(size) vector multiplies instead of a serial cumulative product)."""
        out = np.empty(size, dtype=self.dtype)
        out[0], filled = 1, 1
        with np.errstate(over="ignore"):
            while filled < size:
                take = min(filled, size - filled)
                np.multiply(out[:take], self.dtype(pow(base, filled, 1 << self.bits)), out=out[filled:filled + take])
                filled += take
        return out

    def get(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.fwd) < m:
            size = max(m, 2 * len(self.fwd))
            self.fwd, self.inv = self._table(self.base, size), self._table(self.inverse, size)
        return self.fwd[:m], self.inv[:m]


# Words hash to 32 bits (half the memory traffic of the per-byte pass; collisions only cost an
# exact check), n-grams of word hashes to 64 bits.
_WORD_POWERS, _GRAM_POWERS = _Powers(WORD_BASE, np.uint32), _Powers(GRAM_BASE, np.uint64)


def _span_hashes(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, powers: _Powers) -> np.ndarray:
    """Polynomial hash of values[s:e] for each (s, e): sum_j values[j] * B^(e-1-j) mod 2^bits,
    via prefix sums of values[j] * B^-j."""
    fwd, inv = powers.get(len(values))
    prefix = np.zeros(len(values) + 1, dtype=powers.dtype)
    with np.errstate(over="ignore"):
        np.cumsum(np.multiply(values, inv, dtype=powers.dtype), dtype=powers.dtype, out=prefix[1:])
        return (prefix[ends] - prefix[starts]) * fwd[ends - 1]


def _encode(texts: list[str], sep: str = "\n") -> tuple[np.ndarray, np.ndarray]:
    """The chunk as lowercased UTF-8 bytes joined by `sep`, and each text's start offset."""
    joined = sep.join(texts)
    if joined.isascii():  # the common case: lowercasing keeps every length
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        data = joined.lower().encode("ascii")
    else:
        pieces = [t.lower().encode("ascii") if t.isascii() else UNICODE_SPACE.sub(" ", t.lower()).encode("utf-8")
                  for t in texts]
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(texts))
        data = sep.encode().join(pieces)
    starts = np.zeros(len(texts), dtype=np.int64)
    np.cumsum(lengths[:-1] + len(sep), out=starts[1:])
    return np.frombuffer(data, dtype=np.uint8), starts


def _word_hashes(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start byte, 64-bit hash) of every whitespace-separated word in the buffer."""
    space = np.concatenate(([True], _ASCII_SPACE[buf], [True]))
    edges = np.flatnonzero(space[1:] != space[:-1])
    starts, ends = edges[0::2], edges[1::2]
    return starts, _span_hashes(np.add(buf, 1, dtype=np.uint32), starts, ends, _WORD_POWERS).astype(np.uint64)


def _chunk_grams(texts: list[str], n: int, sep: str):
    """(text start offsets, word start offsets, hash of every window of n consecutive words) of the
    texts joined by `sep`, or None when the chunk has fewer than n words."""
    if not texts:
        return None
    buf, text_starts = _encode(texts, sep)
    if not buf.size:
        return None
    word_starts, words = _word_hashes(buf)
    if len(words) < n:
        return None
    first = np.arange(len(words) - n + 1)
    return text_starts, word_starts, _span_hashes(words, first, first + n, _GRAM_POWERS)


def chunk_ngram_hashes(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, row) for every word n-gram of every text: `row[i]` is the index of the text the
    i-th n-gram comes from. N-grams never span two texts."""
    chunk = _chunk_grams(texts, n, "\n")
    if chunk is None:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    text_starts, word_starts, grams = chunk
    word_row = np.searchsorted(text_starts, word_starts, side="right") - 1
    within = word_row[: len(grams)] == word_row[n - 1:]  # the window stays inside one text
    return grams[within], word_row[: len(grams)][within]


BARRIER = "\n\x00\n"  # between texts: a word of its own, so n-grams across texts match nothing real


def chunk_hits(texts: list[str], n: int, members: HashSet) -> tuple[np.ndarray, np.ndarray]:
    """(row, hash) of the n-grams of `texts` whose hash is in `members`: the scan's fast path.
    Windows are not cut at text boundaries; the barrier word makes a crossing window a stray hit
    at worst, which the caller's exact check on the row's own words discards."""
    chunk = _chunk_grams(texts, n, BARRIER)
    if chunk is None:
        return np.empty(0, np.int64), np.empty(0, np.uint64)
    text_starts, word_starts, grams = chunk
    hit = np.flatnonzero(members.contains(grams))
    return np.searchsorted(text_starts, word_starts[hit], side="right") - 1, grams[hit]


class HashSet:
    """Membership of uint64 hashes: a bit table on the hashes' top bits rules most queries out in
    one lookup; the rest are settled by binary search in the sorted hashes."""

    BITS = 24

    def __init__(self, hashes: np.ndarray):
        self.sorted = np.unique(hashes)
        self.table = np.zeros(1 << self.BITS, dtype=bool)
        self.table[self._slot(self.sorted)] = True

    def _slot(self, hashes: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return ((hashes * np.uint64(GRAM_BASE)) >> np.uint64(64 - self.BITS)).astype(np.int64)

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        hit = self.table[self._slot(hashes)]
        maybe = np.flatnonzero(hit)
        if len(maybe) and len(self.sorted):
            pos = np.searchsorted(self.sorted, hashes[maybe]).clip(max=len(self.sorted) - 1)
            hit[maybe] = self.sorted[pos] == hashes[maybe]
        return hit
