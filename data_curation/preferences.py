"""Preference pairs: the rows reward models and DPO train on.

A pair is a plain dict, like a schema row:

    id        stable id ("synthetic_math/train/3#p0")
    prompt    chat messages, ending with the user turn
    chosen    the preferred assistant response (text)
    rejected  the other response
    reason    why chosen beats rejected ("correct vs wrong", "shortest correct vs 2.1x longer")
    source    where the prompt came from

Built from a model's samples (`pairs_from_samples`, judged by data_curation/rejection.py's rules),
or read from local files with chosen/rejected columns (`load_pairs`: JSONL, Parquet or a `datasets`
directory), where a bad row is named by file and line.
- quality: chosen = verified, finished, readable (language-consistent) samples; rejected = wrong,
  truncated or unreadable ones. Every chosen is paired with every rejected, up to `max_pairs`.
- long2short (Kimi k1.5, section 2.4): chosen = the shortest correct sample; rejected = the wrong
  samples LONGER than it and the correct ones at least `length_ratio` (1.5) times longer. A wrong
  answer as short as the chosen one or shorter is no negative: preferring the chosen over it would
  teach correctness where the stage means to teach length, and a shorter one would teach "longer".
"""

from __future__ import annotations

from pathlib import Path

from data_curation.rejection import Sample, judge
from data_curation.sources.files import BadRow, file_records

PAIR_FIELDS = ("id", "prompt", "chosen", "rejected", "reason", "source")
QUALITY_RULES = ("mixed_language",)


def make_pair(row: dict, k: int, chosen: str, rejected: str, reason: str) -> dict:
    return {"id": f"{row['id']}#p{k}", "prompt": row["prompt"], "chosen": chosen, "rejected": rejected,
            "reason": reason, "source": row.get("source", "")}


def pairs_from_samples(row: dict, samples: list[Sample], mode: str = "quality", length_ratio: float = 1.5,
                       max_pairs: int | None = None) -> list[dict]:
    """Preference pairs for one prompt from its judged samples (no pairs when a side is empty)."""
    verdicts = [judge(row, s, require_thinking=False, rules=QUALITY_RULES) for s in samples]
    good = [s for s, v in zip(samples, verdicts) if v is None]
    if mode == "long2short":
        if not good:
            return []
        shortest = min(good, key=lambda s: s.tokens)
        bad = [(s, f"longer {v[0]}") for s, v in zip(samples, verdicts)
               if v is not None and v[0] != "unjudgeable" and s.tokens > shortest.tokens]
        bad += [(s, f"{s.tokens / max(1, shortest.tokens):.1f}x longer") for s in good
                if s.tokens >= length_ratio * shortest.tokens]
        pairs = [(shortest, s, f"shortest correct vs {why}") for s, why in bad]
    elif mode == "quality":
        bad = [(s, v[0]) for s, v in zip(samples, verdicts) if v is not None and v[0] != "unjudgeable"]
        pairs = [(g, s, f"correct vs {why}") for g in good for s, why in bad]
    else:
        raise ValueError(f"unknown preference mode {mode!r}; expected quality or long2short")
    pairs = pairs[:max_pairs] if max_pairs is not None else pairs
    return [make_pair(row, k, c.text, r.text, why) for k, (c, r, why) in enumerate(pairs)]


def check_pair(pair: dict, where: str) -> None:
    missing = [f for f in ("prompt", "chosen", "rejected") if not pair.get(f)]
    if missing:
        raise BadRow(f"{where}: preference row lacks {missing}")
    prompt = pair["prompt"]
    if not isinstance(prompt, list) or not prompt or prompt[-1].get("role") != "user":
        raise BadRow(f"{where}: prompt must be chat messages ending with a user turn")
    if pair["chosen"] == pair["rejected"]:
        raise BadRow(f"{where}: chosen and rejected are the same response")


def _text(value) -> str | None:
    """A response given as text or as chat messages (the last assistant message's content)."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return value[-1].get("content")
    return value


def load_pairs(path: str, columns: dict | None = None, n: int | None = None) -> list[dict]:
    """Pairs from a local file or a stage's pairs.jsonl; `columns` maps prompt/chosen/rejected to the
    file's names. A prompt given as a string becomes one user turn."""
    columns = columns or {}
    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(f"preference file {path} does not exist")
    pairs = []
    for number, rec in file_records(file):
        where = f"{file}:{number}"
        if isinstance(rec, Exception):
            raise BadRow(f"{where}: malformed row: {rec}")
        def get(field: str, rec: dict = rec):
            return rec.get(columns.get(field, field))

        prompt = get("prompt")
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        pair = {"id": str(get("id") or where), "prompt": prompt, "chosen": _text(get("chosen")),
                "rejected": _text(get("rejected")), "reason": get("reason") or "", "source": get("source") or file.name}
        check_pair(pair, where)
        pairs.append(pair)
        if n is not None and len(pairs) >= n:
            break
    return pairs
