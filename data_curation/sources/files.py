"""`file`: rows from a local JSONL file, Parquet file or `datasets` saved directory.

In a recipe: `data: {path: data/train.jsonl, columns: {question: problem, answer: solution_value}}`.
`columns` maps schema fields to the file's column names; unmapped fields use their own name. A
row needs `question` (or `prompt` as chat messages); `answer`, `solution`, `verifier`
(default: the `verifier` param, "math"), `difficulty` and `language` are optional. Splits are by
a hash of the question, as for every source.

Bad rows (a malformed JSON line, a missing question, a verifiable row without a gold answer)
raise an error naming the file and line, or with `on_bad_rows: skip` are skipped and counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from data_curation.schema import VERIFIERS, make_row
from data_curation.sources.splits import in_split
from toolkit.core.files import dir_fingerprint, sha256_file

NAME = "file"
REQUIRES = None


class BadRow(ValueError):
    """A row that cannot become a schema row; its message starts with file:line."""


def file_records(path: Path) -> Iterator[tuple[int, dict | Exception]]:
    """(line or row number, record or the error that reading it raised)."""
    if path.is_dir():
        from datasets import load_from_disk
        for i, rec in enumerate(load_from_disk(str(path)), 1):
            yield i, rec
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq
        for i, rec in enumerate(pq.read_table(path).to_pylist(), 1):
            yield i, rec
    else:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rec = json.loads(line)
                        yield i, rec if isinstance(rec, dict) else ValueError("not a JSON object")
                    except ValueError as e:
                        yield i, e


def _to_row(rec: dict, columns: dict, verifier: str, where: str) -> dict:
    get = lambda field: rec.get(columns.get(field, field))
    question, prompt = get("question"), get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        question = prompt[-1].get("content")
    elif isinstance(prompt, str) and question is None:
        question = prompt
    if not question:
        raise BadRow(f"{where}: no question (looked for columns {columns.get('question', 'question')!r} "
                     f"and {columns.get('prompt', 'prompt')!r})")
    row_verifier = get("verifier") or verifier
    if row_verifier not in VERIFIERS:
        raise BadRow(f"{where}: unknown verifier {row_verifier!r}")
    answer = get("answer")
    if row_verifier != "none" and (answer is None or str(answer).strip() == ""):
        raise BadRow(f"{where}: verifiable row ({row_verifier}) has no gold answer")
    return make_row(id=str(get("id") or where), question=str(question),
                    answer=None if answer is None else str(answer), verifier=row_verifier,
                    solution=get("solution"), source=f"file:{Path(where.rsplit(':', 1)[0]).name}",
                    difficulty=int(get("difficulty") or 0), language=get("language") or "en")


def rows(split: str = "all", n: int | None = None, seed: int = 0, path: str = "", columns: dict | None = None,
         verifier: str = "math", eval_share: float = 0.2, on_bad_rows: str = "fail",
         skipped: list | None = None) -> Iterator[dict]:
    """`skipped`, when given, collects the messages of skipped bad rows."""
    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(f"data file {path} does not exist")
    made = 0
    for number, rec in file_records(file):
        if n is not None and made >= n:
            return
        where = f"{file}:{number}"
        try:
            if isinstance(rec, Exception):
                raise BadRow(f"{where}: malformed row: {rec}")
            row = _to_row(rec, columns or {}, verifier, where)
        except BadRow as e:
            if on_bad_rows != "skip":
                raise
            if skipped is not None:
                skipped.append(str(e))
            continue
        if in_split(row["prompt"][-1]["content"], split, seed, eval_share):
            yield row
            made += 1


def fingerprint(path: str = "", **_) -> str:

    file = Path(path).expanduser()
    if not file.exists():
        return "missing"
    return dir_fingerprint(file, "*") if file.is_dir() else sha256_file(file)
