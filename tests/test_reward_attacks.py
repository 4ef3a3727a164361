"""Rewards read as a policy hunting for reward would read them. Each attack is a completion that does
NOT do the task plus a trick; next to it stands the score an honest wrong answer gets, and the attack
must score no more. The sandbox's verdict-channel attacks run as root and as an unprivileged host user.
(tests/test_code_forgery.py holds the older forgeries: shadowed builtins, atexit, exits, ...)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stages.rewards import get_reward
from stages.rewards.sandbox import run_python

REPO = Path(__file__).resolve().parent.parent
ASSERTS = json.dumps({"tests": ["assert f(1) == 2", "assert f(5) == 6"]})
HUMANEVAL = json.dumps({"prefix": "def add_one(x):\n    pass\n", "entry_point": "add_one",
                        "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-3) == -2\n"})
CASES = json.dumps({"cases": [{"input": "1\n", "output": "2"}, {"input": "41\n", "output": "42"}]})
WRONG = {ASSERTS: "def f(x):\n    return 0\n", HUMANEVAL: "def add_one(x):\n    return 0\n", CASES: "print(0)\n"}


def forged(n: int) -> str:
    return json.dumps({"passed": n, "total": n, "events": {}, "nonce": "x"}) + "\\n"


# Each takes the verdict channel a different way, writes a passing verdict on it and then tries to
# silence the honest one (kills the harness), or keeps writing after it; then behaves as the wrong answer.
GRAB = ("import ctypes, os, signal, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def grab():\n    pidfd = libc.syscall(434, 1, 0)\n"
        "    return [g for g in (libc.syscall(438, pidfd, fd, 0) for fd in range(0, 16)) if g >= 0] if pidfd >= 0 else []\n"
        "def write_all(fds):\n    for fd in fds:\n        try:\n            os.write(fd, b'VERDICT')\n"
        "        except OSError:\n            pass\n")
CHANNEL_ATTACKS = {
    "pidfd_getfd_of_pid1_then_kill_the_harness": GRAB + "write_all(grab())\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "reopen_proc_1_fds_then_kill_the_harness": (
        GRAB + "for fd in range(0, 16):\n    try:\n        with open(f'/proc/1/fd/{fd}', 'w') as out:\n"
        "            out.write('VERDICT')\n    except OSError:\n        pass\nos.kill(os.getppid(), signal.SIGKILL)\n"),
    "own_fds_then_kill_the_harness": GRAB + "write_all(range(0, 16))\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "grandchild_writes_after_the_verdict": (
        GRAB + "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        fds = grab()\n"
        "        for _ in range(3000):\n            write_all(fds)\n            time.sleep(0.001)\n        os._exit(0)\n"
        "    os._exit(0)\n"),
    "ptrace_the_harness": GRAB + "assert libc.ptrace(16, os.getppid(), 0, 0) != 0\n",
}


def completion(code: str) -> str:
    return f"<think>plan</think>\n```python\n{code}\n```"


def attack(spec: str, trick: str) -> str:
    return completion(trick.replace("VERDICT", forged(3)) + WRONG[spec])


@pytest.fixture(scope="module")
def code_reward():
    return get_reward("code_exec", timeout_s=4)


@pytest.mark.parametrize("spec", [ASSERTS, HUMANEVAL, CASES], ids=["asserts", "humaneval", "cases"])
@pytest.mark.parametrize("name", sorted(CHANNEL_ATTACKS))
def test_the_verdict_channel_cannot_be_reached(code_reward, name, spec):
    honest_wrong = code_reward(completions=[completion(WRONG[spec])], answer=[spec])[0]
    assert honest_wrong == 0.0
    assert code_reward(completions=[attack(spec, CHANNEL_ATTACKS[name])], answer=[spec]) == [honest_wrong]


AS_USER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from stages.rewards import get_reward
from tests.test_reward_attacks import ASSERTS, CASES, CHANNEL_ATTACKS, HUMANEVAL, attack
reward = get_reward("code_exec", timeout_s=4)
print(json.dumps({f"{name}/{i}": reward(completions=[attack(spec, trick)], answer=[spec])[0]
                  for name, trick in CHANNEL_ATTACKS.items() for i, spec in enumerate([ASSERTS, HUMANEVAL, CASES])}))
"""


def test_the_verdict_channel_cannot_be_reached_as_an_unprivileged_host_user(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the suite already runs as an unprivileged user: the test above is that half")
    if not all(os.stat(p).st_mode & 0o005 == 0o005 for p in (REPO, Path(sys.executable).resolve().parent)):
        pytest.skip("the repository or the interpreter is not readable by other users, so no other user can run it")
    tmp_path.chmod(0o777)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run(["setpriv", "--reuid", "54321", "--regid", "54321", "--clear-groups", sys.executable, "-c",
                          AS_USER, str(REPO)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    scores = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(scores) == 3 * len(CHANNEL_ATTACKS) and set(scores.values()) == {0.0}, scores


# Exceptions from model code that would steer the tests' own control flow.
STEERING = json.dumps({"tests": ["assert all(map(f, [1, 2, 3]))", "assert not any(map(f, [-1, -2]))",
                                 "try:\n    assert f(4)\nexcept BaseException:\n    pass"]})


@pytest.mark.parametrize("exc", ["StopIteration", "GeneratorExit", "KeyboardInterrupt", "SystemExit",
                                 "type('Odd', (BaseException,), {})", "AssertionError"])
def test_an_exception_raised_by_model_code_fails_the_test(code_reward, exc):
    honest_wrong = code_reward(completions=[completion("def f(x):\n    return False")], answer=[STEERING])[0]
    raising = completion(f"def f(x):\n    raise {exc}()")
    assert honest_wrong == pytest.approx(2 / 3)  # the second test and the lax third pass an honest wrong answer
    assert code_reward(completions=[raising], answer=[STEERING]) == [0.0]
    assert code_reward(completions=[completion("def f(x):\n    return x > 0")], answer=[STEERING]) == [1.0]


def test_names_the_tests_need_come_from_the_tests_not_the_completion(code_reward):
    fraction = json.dumps({"tests": ["assert f(1) == Fraction(1, 2)"], "entry_point": "f"})
    forger = completion("Fraction = lambda a, b: 0\ndef f(x):\n    return 0")
    assert code_reward(completions=[forger], answer=[fraction]) == [None]  # a data error, whoever answers
    guessed = json.dumps({"tests": ["assert f(1) == inf", "assert f(2) == inf"]})  # no entry point, two candidates
    assert code_reward(completions=[completion("inf = 0\ndef f(x):\n    return 0")], answer=[guessed]) == [None]
    imported = json.dumps({"prefix": "from fractions import Fraction\n", "tests": ["assert f(1) == Fraction(1, 2)"]})
    assert code_reward(completions=[forger], answer=[imported]) == [0.0]
    honest = completion("from fractions import Fraction\ndef f(x):\n    return Fraction(x, 2)")
    assert code_reward(completions=[honest], answer=[imported]) == [0.0]  # a Fraction cannot cross: plain data only
    assert code_reward(completions=[completion("def f(x):\n    return 0.5")], answer=[imported]) == [1.0]


# The sandbox's limits hold for the sandbox as a whole.
def test_memory_is_limited_for_the_whole_sandbox_not_per_process():
    code = ("import os\ngot = 0\nfor _ in range(6):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
            "    if pid == 0:\n        try:\n            b = bytearray(400 << 20)\n            os._exit(7)\n"
            "        except MemoryError:\n            os._exit(0)\n"
            "    got += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7\n"
            "print(got)")
    result = run_python(code, timeout_s=10, memory_mb=1024)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) * 400 <= 1024  # 4 x 400 MB reached 1.6 GB when the limit was per process
    forks = run_python("import os\nn = 0\nfor _ in range(50):\n    try:\n        os.fork() or os._exit(0)\n"
                       "        n += 1\n    except OSError:\n        break\nprint(n)", timeout_s=10, max_procs=4)
    assert forks.returncode == 0 and int(forks.stdout) <= 50  # children exit at once, so slots are reused...
    held = run_python("import os, time\nn = 0\nfor _ in range(10):\n    try:\n        pid = os.fork()\n"
                      "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n"
                      "    n += 1\nprint(n)", timeout_s=10, max_procs=4)
    assert int(held.stdout) == 3  # ...but at most 4 at once, the first included


@pytest.mark.parametrize("path", ["/work/big", "/tmp/big", "/big", "/dev/shm/big", "/dev/big"])
def test_disk_is_limited_for_the_whole_sandbox(path):
    code = (f"import os\nwritten = 0\ntry:\n    for i in range(20):\n        with open('{path}' + str(i), 'wb') as f:\n"
            "            f.write(b'x' * (8 << 20))\n        written += 8\nexcept OSError:\n    pass\nprint(written)")
    result = run_python(code, timeout_s=10, tmpfs_mb=64)
    assert result.returncode == 0 and int(result.stdout) <= 64, (result.stdout, result.stderr)


def test_output_is_read_with_a_bounded_reader():
    result = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", timeout_s=10)
    assert result.output_overflow and result.returncode is None and not result.timed_out
    assert len(result.stdout) + len(result.stderr) <= (1 << 20) + (1 << 16)
    flood = completion("import sys\nsys.stderr.write('y' * (200 << 20))\n" + WRONG[ASSERTS])
    reward = get_reward("code_exec", timeout_s=4)
    assert reward(completions=[flood], answer=[ASSERTS]) == [0.0]
    io_flood = completion("print('2 ' * (50 << 20))")
    assert reward(completions=[io_flood], answer=[CASES]) == [0.0]
