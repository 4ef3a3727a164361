"""code_exec contains hostile completions: each scores 0 and the test process and machine are unharmed;
the sandbox really is isolated; and where it cannot start nothing runs unless a recipe opts in."""

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from toolkit.rewards import get_reward
from toolkit.rewards.sandbox import run_python, sandbox_problem

SPEC = json.dumps({"tests": ["assert f() == 1"]})
HOSTILE = {
    "socket": "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)\ndef f(): return 1",
    "fork_bomb": "import os\nwhile True:\n    os.fork()\ndef f(): return 1",
    "allocate_10gb": "x = bytearray(10 * 1024 ** 3)\ndef f(): return 1",
    "infinite_loop": "while True:\n    pass\ndef f(): return 1",
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


def test_the_harness_survives_every_signal_its_child_sends():
    """The harness is the sandbox's pid 1: a child cannot stop, kill or interrupt it, so a correct
    program that tries still gets its honest verdict (and a wrong one its honest 0)."""
    reward = get_reward("code_exec", timeout_s=5)
    send = ("import os, signal\nfor s in ('SIGKILL', 'SIGSTOP', 'SIGINT', 'SIGTERM', 'SIGPIPE'):\n"
            "    os.kill(1, getattr(signal, s))\n")
    assert reward(completions=[completion(send + "def f(): return 1")], answer=[SPEC]) == [1.0]
    assert reward(completions=[completion(send + "def f(): return 2")], answer=[SPEC]) == [0.0]


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
    # The marker names this test's processes: another test's sandbox may run beside it (xdist), under
    # the same uid range, and is none of this test's business.
    marker = f"fork bomb {os.getpid()} {time.time_ns()}"
    code = f"# {marker}\nimport os, time\nfor _ in range(20):\n    if os.fork() == 0:\n        time.sleep(60)\ntime.sleep(60)"
    result = run_python(code, timeout_s=2, max_procs=32, memory_mb=2048)
    assert result.timed_out
    time.sleep(0.3)
    sleepers = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and marker.encode() in (p / "cmdline").read_bytes() \
                    and (p / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                sleepers.append(p.name)
        except OSError:
            pass
    assert sleepers == []


def test_a_socket_cannot_reach_a_real_listener_on_loopback():
    accepted = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(4)
        port = server.getsockname()[1]

        def accept():
            try:
                accepted.append(server.accept())
            except OSError:
                pass
        waiter = threading.Thread(target=accept)
        waiter.start()
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\n"
                "except OSError as e:\n    print('refused', type(e).__name__)")
        result = run_python(code, timeout_s=5)
        waiter.join()
    assert result.stdout.startswith("refused") and accepted == []
    # the same connection from this (unsandboxed) process would have been accepted: the test can fail
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=2).close()
        assert server.accept()


PROBE = """
import json, os, socket
status = dict(line.split(':\t', 1) for line in open('/proc/self/status').read().splitlines() if ':\t' in line)
print(json.dumps({"uid": os.getuid(), "pid": os.getpid(), "pids": sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),
                  "root": sorted(os.listdir('/')), "cwd": os.getcwd(), "hostname": socket.gethostname(),
                  "no_new_privs": status['NoNewPrivs'].strip(), "cap_eff": status['CapEff'].strip(),
                  "interfaces": [name for _, name in socket.if_nameindex()], "env": sorted(os.environ),
                  "visible": {p: os.path.exists(p) for p in PATHS}}))
"""


def test_the_sandbox_is_isolated(home):
    import sys

    repo = str(Path(__file__).resolve().parent.parent)
    paths = [repo, str(home), sys.prefix, "/root", "/home", "/etc/passwd", "/var"]
    result = run_python(PROBE.replace("PATHS", repr(paths)), timeout_s=10)
    assert result.engine == "bwrap" and result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["uid"] == 65534 and seen["cap_eff"] == "0000000000000000" and seen["no_new_privs"] == "1"
    assert max(seen["pids"]) < 10  # its own pid namespace: only bwrap's init and itself
    assert seen["interfaces"] == ["lo"] and seen["hostname"] == "sandbox"
    assert set(seen["root"]) <= {"bin", "dev", "lib", "lib64", "proc", "sbin", "tmp", "usr", "work"}
    assert seen["cwd"] == "/work" and set(seen["env"]) <= {"PATH", "LANG", "HOME", "TMPDIR", "PWD"}
    assert not any(seen["visible"].values()), seen["visible"]  # not the repo, $POSTTRAIN_HOME, the venv, homes


def test_no_silent_fallback_when_bwrap_is_missing(monkeypatch, tmp_path):
    from pipeline.recipe import RecipeError, load_recipe
    from toolkit.rewards import SandboxUnavailable

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    sandbox_problem.cache_clear()
    try:
        assert "bubblewrap (bwrap) is not installed" in sandbox_problem()
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
            get_reward("code_exec")
        with pytest.raises(RecipeError, match=r"stages\[0\]\.rewards\[2\]\.params: reward code_exec: code execution needs"):
            load_recipe("r1_zero", "tiny", ["stages.zero_rl.rewards=[{name: accuracy_math, params: {answer_tags: true}}, "
                                            "{name: format_think}, {name: code_exec}]"])
        unsafe = get_reward("code_exec", allow_unsandboxed=True, timeout_s=5)
        assert unsafe.tags == {"posttrain.sandbox": "unsandboxed"}
        # even unsandboxed, model code never runs as root
        result = run_python("import os\nprint(os.getuid())", allow_unsandboxed=True, timeout_s=5)
        assert result.engine == "unsandboxed" and (os.geteuid() != 0 or int(result.stdout) >= 200_000)
        assert unsafe(completions=["def f():\n    return 1"], answer=[SPEC]) == [1.0]
    finally:
        sandbox_problem.cache_clear()
