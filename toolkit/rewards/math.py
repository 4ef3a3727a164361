"""Math answer checking with math-verify.

Departures from peers, on purpose:
- The gold answer always goes first (`verify(gold, pred)` is not symmetric).
- A gold answer that cannot be judged makes the sample unjudgeable (None), never 1.0: one that
  math-verify only returns as a raw string, and one written in words (`forty two`, `none`, `yes`),
  which math-verify would read as a product of one-letter symbols, so that `\\boxed{neon}` would
  match `none`. A gold counts as words when, LaTeX commands aside, it holds a run of two or more
  letters that is not a function, constant or unit name; so implicit products such as `ab` are
  unjudged too (write `a b` or `a \\cdot b`).
- math-verify's own timeouts use signal.alarm, which fails outside the main thread; they are
  switched off and the pool (toolkit/rewards/pool.py) enforces a hard per-sample timeout instead.

Where the answer is read from follows the template: `answer_tags` reads the last
`<answer>...</answer>` block (R1-Zero), `after_think` only the text after `</think>` (unfinished
thinking scores 0), `bare_answer` the whole short reply when it has no `\\boxed{}` (no-CoT probes).
"""

from __future__ import annotations

import functools
import logging
import re

from toolkit.core.text import answer_region, extract_answer
from toolkit.rewards.base import Reward, completion_text
from toolkit.rewards.pool import ScoringPool

LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
LETTER_RUN = re.compile(r"[A-Za-z]{2,}")
MATH_WORDS = frozenset(
    "sqrt sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln lg exp pi infty inf oo floor ceil "
    "max min gcd lcm mod det deg circ cm mm km kg mg ml hr hrs mph units dollars cents degrees meters inches "
    "feet".split())
BARE_ANSWER_MAX_CHARS = 40
# An answer far bigger than its gold, or with a far deeper tower of powers or factorials, is wrong
# however it simplifies; rejecting it before sympy sees it keeps exponent towers and million-digit
# numbers from holding a scoring worker for the whole timeout.
ANSWER_SLACK_CHARS, ANSWER_SIZE_FACTOR, EXTRA_OPERATORS = 64, 4, 3


@functools.cache
def math_verify():
    """(parse, verify, extraction configs), imported on first use: math-verify pulls in sympy and
    latex2sympy (a quarter second), which validating a recipe or rerunning a cached one never needs."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # We enforce our own limits; silence its "timeout is disabled" notice on every call.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return parse, verify, [LatexExtractionConfig(), ExprExtractionConfig()]


def is_prose(gold: str) -> bool:
    words = LETTER_RUN.findall(LATEX_COMMAND.sub(" ", gold))
    return any(w.lower() not in MATH_WORDS for w in words)


def parse_gold(gold: str):
    """Parsed gold, or None when it cannot be judged: words rather than mathematics, or nothing
    math-verify understood (comparing raw strings would let a broken gold score 1.0 against an
    identical broken answer)."""
    gold = gold.replace("\\$", "").strip()  # currency: "\$5" is the number 5
    if is_prose(gold):
        return None
    text = gold if ("\\boxed" in gold or "$" in gold) else f"${gold}$"
    parse, _, any_form = math_verify()
    parsed = parse(text, extraction_config=any_form, parsing_timeout=None)
    return parsed if any(not isinstance(p, str) for p in parsed) else None


def score_math(gold: str | None, completion: str, answer_is_fallback: bool = True, answer_tags: bool = False,
               after_think: bool = False, bare_answer: bool = False) -> float | None:
    """1.0 / 0.0 for a judged sample; None when the gold answer itself is missing or cannot be judged."""
    if not gold:
        return None
    gold_parsed = parse_gold(str(gold))
    if gold_parsed is None:
        return None
    region = answer_region(completion, answer_tags, after_think)
    if region is None:
        return 0.0
    answer = extract_answer(region, answer_is_fallback)
    if answer is None and (answer_tags or bare_answer):
        bare = region.strip().rstrip(".")
        answer = bare if 0 < len(bare) <= BARE_ANSWER_MAX_CHARS and "\n" not in bare else None
    if answer is None or oversized(answer, str(gold)):
        return 0.0
    parse, verify, any_form = math_verify()
    pred = parse(f"${answer}$", extraction_config=any_form, parsing_timeout=None)
    if not pred:
        return 0.0
    return 1.0 if verify(gold_parsed, pred, timeout_seconds=None) else 0.0


def oversized(answer: str, gold: str) -> bool:
    """Sizes no equal answer needs: far longer than the gold, or many more `^` / `!` than it has."""
    return (len(answer) > ANSWER_SLACK_CHARS + ANSWER_SIZE_FACTOR * len(gold)
            or any(answer.count(op) > gold.count(op) + EXTRA_OPERATORS for op in "^!"))


_POOLS: dict[tuple, object] = {}


def shared_pool(workers: int | None, timeout_s: float):
    """One scoring pool per (workers, timeout) and process, started on first use."""
    key = (workers, timeout_s)
    if key not in _POOLS:
        _POOLS[key] = ScoringPool(score_math, workers=workers, timeout_s=timeout_s, preload=("math_verify",))
    return _POOLS[key]


class AccuracyMath(Reward):
    """1.0 when the completion's final answer equals the gold `answer`, else 0.0; None if unjudgeable.

    With `pooled` (the default), samples are scored in worker processes with a hard per-sample
    timeout and a per-batch budget (`batch_budget_s`, default: one timeout plus 50 ms a sample): a
    timed-out sample scores 0.0, a sample whose scoring raised gets None; all are counted
    (`counters`: timeouts, budget_cuts, errors, unjudged), logged on the stage's MLflow run.
    """
    name = "accuracy_math"
    accuracy = True

    def __init__(self, answer_is_fallback: bool = True, answer_tags: bool = False, after_think: bool = False,
                 bare_answer: bool = False, timeout_s: float = 5.0, workers: int | None = None, pooled: bool = True,
                 batch_budget_s: float | None = None):
        super().__init__("timeouts", "budget_cuts", "errors", "unjudged")
        self.options = (answer_is_fallback, answer_tags, after_think, bare_answer)
        self.timeout_s, self.workers, self.pooled, self.batch_budget_s = timeout_s, workers, pooled, batch_budget_s

    def __call__(self, prompts=None, completions=(), answer=(), **_) -> list[float | None]:
        items = [(g, completion_text(c), *self.options) for g, c in zip(answer, completions)]
        if self.pooled:
            pool = shared_pool(self.workers, self.timeout_s)
            before = (pool.timeouts, pool.budget_cuts, pool.errors)
            budget = self.batch_budget_s if self.batch_budget_s is not None else self.timeout_s + 0.05 * len(items)
            scores = pool.map(items, on_timeout=0.0, on_error=None, budget_s=budget)
            for key, was, now in zip(("timeouts", "budget_cuts", "errors"), before,
                                     (pool.timeouts, pool.budget_cuts, pool.errors)):
                self.counters[key] += now - was
        else:
            scores = [score_math(*item) for item in items]
        self.counters["unjudged"] += sum(s is None for s in scores)
        return scores
