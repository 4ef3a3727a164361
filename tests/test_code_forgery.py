"""code_exec cannot be talked into a score: every forgery attempt below ships a WRONG solution plus a
trick to make it look right, and scores 0; the honest solution of the same problem scores 1."""

import json
import pickle

import pytest

from toolkit.rewards import get_reward

ASSERTS = json.dumps({"tests": ["assert f(1) == 2", "assert f(5) == 6", "assert abs(f(0.5) - 1.5) < 1e-9"]})
HUMANEVAL = json.dumps({"prefix": 'def add_one(x):\n    """Return x + 1."""\n', "entry_point": "add_one",
                        "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-3) == -2\n"})
CASES = json.dumps({"cases": [{"input": "1\n", "output": "2"}, {"input": "41\n", "output": "42\n"}]})
HONEST = {ASSERTS: "def f(x):\n    return x + 1", HUMANEVAL: "    return x + 1\n", CASES: "print(int(input()) + 1)"}
VERDICT = '{"passed": 3, "total": 3, "events": {}}'
WRONG = "def f(x):\n    return 0\n"
WRONG_HE = "def add_one(x):\n    return 0\n"

FORGERIES = {
    # reporting forged results
    "atexit_marker": (ASSERTS, WRONG + "import atexit\natexit.register(lambda: print('__POSTTRAIN_PASSED__', 1e9))"),
    "print_verdict": (ASSERTS, WRONG + f"print({VERDICT!r})\nprint({VERDICT!r}, flush=True)"),
    "atexit_verdict": (ASSERTS, WRONG + f"import atexit\natexit.register(print, {VERDICT!r})"),
    "spray_every_fd": (ASSERTS, WRONG + "import os\nfor fd in range(64):\n    try:\n"
                       f"        os.write(fd, ({VERDICT!r} + '\\n').encode())\n    except OSError:\n        pass"),
    "write_harness_stdout": (ASSERTS, WRONG + "import os\ntry:\n    with open(f'/proc/{os.getppid()}/fd/1', 'w') as out:\n"
                             f"        out.write({VERDICT!r} + '\\n')\nexcept OSError:\n    pass"),
    "read_harness_memory": (ASSERTS, "import os, re\ntry:\n    mem = open(f'/proc/{os.getppid()}/mem', 'rb')\n"
                            "except OSError:\n    mem = None\ndef f(x):\n    return 0 if mem is None else 2"),
    # shadowing what the tests run with
    "shadow_exec": (ASSERTS, "exec = lambda *a, **k: None\n" + WRONG),
    "shadow_abs": (ASSERTS, "def abs(x):\n    return 0\n" + WRONG),
    "patch_builtins": (ASSERTS, "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\n"
                       "builtins.abs = lambda x: 0\nbuiltins.exec = lambda *a, **k: None\n" + WRONG),
    "shadow_check": (HUMANEVAL, WRONG_HE + "def check(candidate):\n    return True\n"),
    "always_equal_object": (ASSERTS, "class Yes:\n    def __eq__(self, other):\n        return True\n"
                            "    def __sub__(self, other):\n        return 0\n    __abs__ = lambda self: 0\n"
                            "def f(x):\n    return Yes()"),
    "int_subclass_equal": (ASSERTS, "class Eq(int):\n    def __eq__(self, other):\n        return True\n"
                           "def f(x):\n    return Eq(0)"),
    # exit paths other than "the tests ran and passed"
    "sys_exit_at_load": (ASSERTS, WRONG + "import sys\nsys.exit(0)"),
    "os_exit_at_load": (ASSERTS, WRONG + "import os\nos._exit(0)"),
    "exit_inside_call": (HUMANEVAL, "def add_one(x):\n    import os\n    os._exit(0)\n"),
    "system_exit_inside_call": (HUMANEVAL, "def add_one(x):\n    raise SystemExit(0)\n"),
    "kill_the_harness": (HUMANEVAL, "def add_one(x):\n    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n"),
    "stop_the_harness": (ASSERTS, "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n" + WRONG),
    # stdin/stdout cases
    "io_print_verdict": (CASES, f"print({VERDICT!r})"),
    "io_guess_from_parent": (CASES, "import os\ntry:\n    print(open(f'/proc/{os.getppid()}/cmdline').read())\n"
                             "except OSError:\n    print(0)"),
    "io_exit_zero_silently": (CASES, "import os\nos._exit(0)"),
}


def completion(code: str) -> str:
    return f"<think>plan</think>\n```python\n{code}\n```"


@pytest.fixture(scope="module")
def reward():
    return get_reward("code_exec", timeout_s=4)


@pytest.mark.parametrize("spec", [ASSERTS, HUMANEVAL, CASES], ids=["asserts", "humaneval", "cases"])
def test_honest_solutions_score_one(reward, spec):
    assert reward(completions=[completion(HONEST[spec])], answer=[spec]) == [1.0]


def test_there_are_at_least_fifteen_forgeries():
    assert len(FORGERIES) >= 15


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forgery_scores_zero(reward, name):
    spec, code = FORGERIES[name]
    assert reward(completions=[completion(code)], answer=[spec]) == [0.0], name


def test_scores_are_fractions_clamped_to_one(reward):
    half = "def f(x):\n    return 2 if x == 1 else 0"
    assert reward(completions=[completion(half)], answer=[ASSERTS]) == [pytest.approx(1 / 3)]
    strict = get_reward("code_exec", timeout_s=4, cases_scoring="all")
    one_case = "x = int(input())\nprint(2 if x == 1 else 0)"
    assert reward(completions=[completion(one_case)], answer=[CASES]) == [0.5]
    assert strict(completions=[completion(one_case)], answer=[CASES]) == [0.0]


def test_malformed_tests_are_unjudged_not_zero(reward):
    before = reward.counters["unjudged"]
    assert reward(completions=[completion(WRONG)], answer=[json.dumps({"tests": []})]) == [None]
    assert reward(completions=[completion(WRONG)], answer=["not json"]) == [None]
    assert reward.counters["unjudged"] == before + 2


def test_counters_count_runs_timeouts_and_memory(reward):
    before = dict(reward.counters)
    slow = "def f(x):\n    while True:\n        pass"
    hungry = "def f(x):\n    return len(bytearray(8 * 1024 ** 3))"
    reward(completions=[completion(slow), completion(hungry)], answer=[ASSERTS, ASSERTS])
    assert reward.counters["sandbox_runs"] == before["sandbox_runs"] + 2
    assert reward.counters["timeouts"] > before["timeouts"]
    assert reward.counters["memory_kills"] > before["memory_kills"]


def test_every_reward_pickles():
    from toolkit.rewards import REWARDS

    needs = {"language_consistency": {"language": "en"}, "reward_model": {"model": "rm/model", "scope": "answer"}}
    for name in REWARDS:
        copy = pickle.loads(pickle.dumps(get_reward(name, **needs.get(name, {}))))
        # reward_model is named per scope: a stage may score the answer and the whole response
        assert copy.__name__ == (name if name != "reward_model" else "reward_model_answer")
