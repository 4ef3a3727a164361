"""`champ`: the 270 competition problems of CHAMP (Mao et al., 2024) with step-by-step solutions
and final answers, from the PyPI package `champ-dataset` (its data file ships inside the wheel).

CHAMP has no difficulty labels; `difficulty` is the solution's length in steps, bucketed 1-5
(1-2 steps -> 1, ..., 9+ steps -> 5). Verifier: math. Answers that math-verify cannot parse (a few
are sentences) come back unjudged rather than wrong.
"""

from __future__ import annotations

from collections.abc import Iterator

from data_curation.schema import make_row
from data_curation.sources.splits import in_split

NAME = "champ"
VERIFIERS = ("math",)  # what its rows are judged by (recipe validation reasons with it)
REQUIRES = ("champ_dataset", "champ-dataset")  # import name, PyPI name


def _problems():
    try:
        import champ_dataset
    except ImportError as e:
        raise ImportError("source champ needs the PyPI package champ-dataset (pip install champ-dataset)") from e
    return champ_dataset.load("v0").problems


def fingerprint(**_) -> str:
    from importlib.metadata import version
    return f"champ-dataset=={version('champ-dataset')}"


def rows(split: str = "all", n: int | None = None, seed: int = 0, eval_share: float = 0.2) -> Iterator[dict]:
    made = 0
    for identifier, p in sorted(_problems().items()):
        if n is not None and made >= n:
            return
        if not in_split(identifier, split, seed, eval_share):
            continue
        steps = [s.text for s in p.solution.steps]
        solution = "<think>\n" + "\n".join(steps) + f"\n</think>\n\nThe answer is \\boxed{{{p.answer}}}."
        yield make_row(id=f"{NAME}/{identifier}", question=p.text, answer=p.answer, verifier="math",
                       solution=solution, source=NAME, difficulty=min(5, 1 + (len(steps) - 1) // 2))
        made += 1
