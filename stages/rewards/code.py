"""`code_exec`: run a completion's code against the row's tests in the sandbox.

The row's `answer` carries the tests as JSON, in one of two shapes:
    {"test": "def check(candidate): ...", "entry_point": "f", "prefix": "<prompt code>"}   HumanEval: pass/fail
    {"tests": ["assert f(1) == 2", ...], "prefix": ""}                                       pass fraction
The code is the last ```python block of the answer part (after </think>), or the whole answer.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

from stages.rewards.format import split_thinking
from stages.rewards.sandbox import run_python

FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
MARKER = "__POSTTRAIN_PASSED__"


def extract_code(text: str) -> str:
    _, answer = split_thinking(text)
    blocks = FENCE.findall(answer)
    return blocks[-1] if blocks else answer


def build_program(code: str, spec: dict) -> str:
    prefix = spec.get("prefix", "")
    body = code if (not prefix or code.lstrip().startswith(("def ", "import ", "from "))) else prefix + code
    if "tests" in spec:
        checks = "\n".join(
            f"try:\n    exec({t!r}, globals())\n    _passed += 1\nexcept BaseException:\n    pass" for t in spec["tests"])
        return f"{body}\n\n_passed = 0\n{checks}\nprint({MARKER!r}, _passed / {len(spec['tests'])})\n"
    return f"{body}\n\n{spec['test']}\n\ncheck({spec['entry_point']})\nprint({MARKER!r}, 1.0)\n"


def score_code(completion: str, answer: str | None, timeout_s: float = 10.0, memory_mb: int = 1024) -> float | None:
    if not answer:
        return None
    try:
        spec = json.loads(answer)
    except ValueError:
        return None
    result = run_python(build_program(extract_code(completion), spec), timeout_s=timeout_s, memory_mb=memory_mb)
    if result.timed_out:
        return 0.0
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(MARKER):
            return float(line.split()[-1])
    return 0.0


def code_exec(timeout_s: float = 10.0, memory_mb: int = 1024, parallel: int = 2):
    from stages.rewards import completion_text

    def reward(prompts=None, completions=(), answer=(), **_):
        with ThreadPoolExecutor(max_workers=parallel) as ex:  # each sample is its own sandboxed process
            return list(ex.map(lambda ca: score_code(completion_text(ca[0]), ca[1], timeout_s, memory_mb),
                               zip(completions, answer)))
    return reward
