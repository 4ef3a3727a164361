"""`code_exec`: run a completion's code against the row's tests in the sandbox.

The row's `answer` carries the tests as JSON, in one of three shapes:
    {"test": "def check(candidate): ...", "entry_point": "f", "prefix": "<prompt code>"}  HumanEval: pass/fail
    {"tests": ["assert f(1) == 2", ...], "prefix": "", "entry_point": "f" (optional)}    pass fraction
    {"cases": [{"input": "1 2\\n", "output": "3"}, ...]}                                   stdin/stdout cases
The code is the last ```python block of the answer part (after </think>), or the whole answer.
Cases are scored as the fraction passed, or 1/0 for all-or-nothing with `cases_scoring: all`.

How a result is trusted: the completion runs in its own process inside the sandbox and the tests
run in the harness (toolkit/rewards/harness.py), the sandbox's pid 1, which only ever receives plain
data from it and writes its verdict, stamped with a one-time nonce, on a private pipe only the
harness holds (toolkit/rewards/sandbox.py says what keeps model code away from it). The host takes
exactly one verdict line with the right nonce from a harness that exited 0; no verdict, two, a
malformed one, a wrong nonce, a non-zero exit, a timeout, an output flood: the sample scores 0. A
row whose tests cannot run as given (a name they use is defined nowhere) is unjudged (None).
Scores are clamped to [0, 1].
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from toolkit.core.text import answer_region
from toolkit.rewards import harness
from toolkit.rewards.base import Reward, completion_text
from toolkit.rewards.sandbox import SANDBOX_TAG, Limits, require_sandbox, run_python, sandbox_python

FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
log = logging.getLogger(__name__)
HARNESS = Path(harness.__file__).read_text()  # its source runs inside the sandbox (`python -c`)
STARTUP_S = 3.0  # bwrap, the harness and the child's interpreter start before the test budget runs
COUNTERS = ("sandbox_runs", "timeouts", "memory_kills", "harness_errors", "output_floods", "unjudged")


def extract_code(text: str) -> str:
    """The last fenced block of the answer (the answer itself when it has none); no code when the
    thinking is unclosed or its tags are out of order, so a stray `</think>` cannot hand the tests
    code written inside the thinking."""
    answer = answer_region(text, after_think=None)
    if answer is None:
        return ""
    blocks = FENCE.findall(answer)
    return blocks[-1] if blocks else answer


def parse_tests(answer: str | None) -> dict | None:
    """The row's test spec, or None when it is missing or not one of the three shapes."""
    if not answer:
        return None
    try:
        spec = json.loads(answer)
    except ValueError:
        return None
    if not isinstance(spec, dict):
        return None
    if isinstance(spec.get("test"), str) and isinstance(spec.get("entry_point"), str):
        return {**spec, "mode": "check"}
    if isinstance(spec.get("tests"), list) and spec["tests"] and all(isinstance(t, str) for t in spec["tests"]):
        return {**spec, "mode": "asserts"}
    cases = spec.get("cases")
    if isinstance(cases, list) and cases and all(isinstance(c, dict) and {"input", "output"} <= set(c) for c in cases):
        return {**spec, "mode": "io"}
    return None


def build_job(code: str, spec: dict, limits: Limits) -> dict:
    prefix = spec.get("prefix") or ""
    # A HumanEval completion may continue the prompt (a function body) or restate the function.
    program = code if (not prefix or code.lstrip().startswith(("def ", "import ", "from ", "class "))) else prefix + code
    job = {"mode": spec["mode"], "program": program, "prefix": prefix, "python": sandbox_python(),
           "budget_s": limits.timeout_s, "call_timeout_s": limits.timeout_s, "max_procs": limits.max_procs,
           "nonce": secrets.token_hex(16)}
    for key in ("test", "entry_point", "tests", "cases"):
        if key in spec:
            job[key] = spec[key]
    return job


def read_verdict(channel: bytes | None, nonce: str) -> dict | None:
    """The harness's verdict: exactly one JSON line carrying `nonce`, either a data error or a
    well-formed pass count; None for anything else."""
    if not channel or channel.count(b"\n") != 1 or not channel.endswith(b"\n"):
        return None
    try:
        verdict = json.loads(channel)
    except ValueError:
        return None
    if not isinstance(verdict, dict) or verdict.get("nonce") != nonce:
        return None
    if isinstance(verdict.get("data_error"), str):
        return verdict
    ok = (type(verdict.get("passed")) is int and type(verdict.get("total")) is int
          and 0 <= verdict["passed"] <= verdict["total"] and verdict["total"] > 0)
    return verdict if ok else None


def score_code(completion: str, answer: str | None, limits: Limits, counters: dict | None = None,
               cases_scoring: str = "fraction", allow_unsandboxed: bool = False) -> float | None:
    """The share of tests passed, in [0, 1]; None when the row's tests are missing or malformed.
    What happened (sandbox runs, timeouts, memory kills, harness errors) is added to `counters`."""
    counters = counters if counters is not None else dict.fromkeys(COUNTERS, 0)
    spec = parse_tests(answer)
    if spec is None:
        counters["unjudged"] += 1
        return None
    job = build_job(extract_code(completion), spec, limits)
    host_limits = Limits(**{**limits.__dict__, "timeout_s": limits.timeout_s + STARTUP_S})
    result = run_python(HARNESS, stdin=json.dumps(job).encode(), limits=host_limits,
                        allow_unsandboxed=allow_unsandboxed, channel=True)
    counters["sandbox_runs"] += 1
    if result.timed_out:
        counters["timeouts"] += 1
        return 0.0
    if result.output_overflow:
        counters["output_floods"] += 1
        return 0.0
    verdict = read_verdict(result.channel, job["nonce"]) if result.returncode == 0 else None
    if verdict is None:  # the harness died (out of memory, say), exited badly or spoke nonsense
        counters["harness_errors"] += 1
        return 0.0
    if "data_error" in verdict:
        log.warning("code_exec: the row's tests cannot run as given: %s", verdict["data_error"])
        counters["unjudged"] += 1
        return None
    events = verdict.get("events") or {}
    counters["timeouts"] += int(events.get("timeouts", 0))
    counters["memory_kills"] += int(events.get("memory_errors", 0))
    share = verdict["passed"] / verdict["total"]
    if spec["mode"] == "io" and (spec.get("scoring") or cases_scoring) == "all":
        share = float(share == 1.0)
    return min(1.0, max(0.0, share))


class CodeExec(Reward):
    name = "code_exec"
    accuracy = True

    """`score_code` per sample, `parallel` sandboxes at a time. Picklable. Building it
    checks the sandbox, so a stage that cannot run code safely fails before its first rollout."""

    def __init__(self, timeout_s: float = 10.0, memory_mb: int = 1024, parallel: int = 2,
                 cases_scoring: Literal["fraction", "all"] = "fraction", allow_unsandboxed: bool = False):
        if cases_scoring not in ("fraction", "all"):
            raise ValueError(f"code_exec: cases_scoring must be 'fraction' or 'all', not {cases_scoring!r}")
        super().__init__(*COUNTERS)
        self.limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb)
        self.parallel, self.cases_scoring, self.allow_unsandboxed = parallel, cases_scoring, allow_unsandboxed
        self.tags[SANDBOX_TAG] = require_sandbox(allow_unsandboxed)

    def __call__(self, prompts=None, completions=(), answer=(), **_) -> list[float | None]:
        def one(pair):
            counts = dict.fromkeys(COUNTERS, 0)  # per sample, summed below: no shared writes across threads
            return score_code(completion_text(pair[0]), pair[1], self.limits, counts, self.cases_scoring,
                              self.allow_unsandboxed), counts

        with ThreadPoolExecutor(max_workers=self.parallel) as ex:  # each sample is its own sandboxed process
            results = list(ex.map(one, zip(completions, answer)))
        for _, counts in results:
            for key, n in counts.items():
                self.counters[key] += n
        return [score for score, _ in results]
