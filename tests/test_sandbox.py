"""code_exec contains hostile completions: each scores 0 and the test process and machine are unharmed."""

import json
import os
import time
from pathlib import Path

import pytest

from stages.rewards import get_reward
from stages.rewards.sandbox import run_python

SPEC = json.dumps({"tests": ["assert f() == 1"]})
HOSTILE = {
    "socket": "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)\ndef f(): return 1",
    "fork_bomb": "import os\nwhile True:\n    os.fork()\ndef f(): return 1",
    "allocate_10gb": "x = bytearray(10 * 1024 ** 3)\ndef f(): return 1",
    "infinite_loop": "while True:\n    pass\ndef f(): return 1",
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef f(): return 1",
}


def completion(code: str) -> str:
    return f"<think>plan</think>\n```python\n{code}\n```"


def test_honest_code_passes():
    reward = get_reward("code_exec", timeout_s=5)
    assert reward(completions=[completion("def f():\n    return 1")], answer=[SPEC]) == [1.0]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_code_scores_zero_and_is_contained(name):
    reward = get_reward("code_exec", timeout_s=3)
    start = time.time()
    assert reward(completions=[completion(HOSTILE[name])], answer=[SPEC]) == [0.0]
    assert time.time() - start < 15
    assert os.getppid() > 0  # we are still here; so is our parent


def test_writes_outside_the_temp_dir_do_not_land(tmp_path):
    target = tmp_path / "escaped.txt"
    code = (f"try:\n    open({str(target)!r}, 'w').write('x')\nexcept OSError:\n    pass\n"
            "open('/tmp/sandbox_probe.txt', 'w').write('x')\ndef f(): return 0")
    reward = get_reward("code_exec", timeout_s=5)
    assert reward(completions=[completion(code)], answer=[SPEC]) == [0.0]
    assert not target.exists()
    assert not Path("/tmp/sandbox_probe.txt").exists()  # the sandbox's /tmp was its own tmpfs


def test_environment_secrets_are_not_visible(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_TEST_SECRET", "hunter2")
    code = ("import os\nsecret = os.environ.get('POSTTRAIN_TEST_SECRET', '')\n"
            "try:\n    secret += open(f'/proc/{os.getppid()}/environ').read()\nexcept OSError:\n    pass\n"
            "print('SECRET' if 'hunter2' in secret else 'none')")
    result = run_python(code, timeout_s=5)
    assert result.returncode == 0 and result.stdout.strip() == "none"


def test_no_process_outlives_a_fork_bomb():
    result = run_python("import os, time\nfor _ in range(20):\n    if os.fork() == 0:\n        time.sleep(60)\ntime.sleep(60)",
                        timeout_s=2)
    assert result.timed_out
    time.sleep(0.3)
    sleepers = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if p.stat().st_uid >= 200_000 and (p / "stat").read_text().split()[2] != "Z":
                    sleepers.append(p.name)
            except OSError:
                pass
    assert sleepers == []
