"""The one row schema every data source produces.

A row is a plain dict so it moves through `datasets`, JSONL files and worker processes unchanged:

    id          stable id, unique within its source ("synthetic_math/train/17")
    prompt      chat messages, [{"role": "user", "content": ...}]
    answer      gold answer as a string (None when the verifier is "none")
    verifier    how a completion is judged: "math", "code", "ifeval" or "none"
    solution    a reference completion (worked reasoning + answer) for SFT, or None
    source      the source name
    difficulty  integer level (1 = easiest), 0 when unknown
    language    ISO code of the prompt's language
"""

from __future__ import annotations

VERIFIERS = ("math", "code", "ifeval", "none")
FIELDS = ("id", "prompt", "answer", "verifier", "solution", "source", "difficulty", "language")


def make_row(*, id: str, question: str, answer: str | None, verifier: str, solution: str | None,
             source: str, difficulty: int = 0, language: str = "en",
             system: str | None = None) -> dict:
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; expected one of {VERIFIERS}")
    prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return {"id": id, "prompt": prompt, "answer": answer, "verifier": verifier, "solution": solution,
            "source": source, "difficulty": int(difficulty), "language": language}


def check_row(row: dict, where: str) -> None:
    """Raise ValueError naming `where` when a row breaks the schema."""
    missing = [f for f in FIELDS if f not in row]
    if missing:
        raise ValueError(f"{where}: row lacks fields {missing}")
    if row["verifier"] not in VERIFIERS:
        raise ValueError(f"{where}: unknown verifier {row['verifier']!r}")
    if row["verifier"] != "none" and not row["answer"]:
        raise ValueError(f"{where}: verifiable row ({row['verifier']}) has no gold answer")
    if not row["prompt"] or row["prompt"][-1].get("role") != "user":
        raise ValueError(f"{where}: prompt must end with a user message")
