"""Run untrusted Python (model-written code) contained.

As root (CI and our workers): the child gets its own network namespace (no interfaces but a down
loopback: no network), its own mount namespace with fresh tmpfs over /tmp, /var/tmp and /dev/shm
(its working dir lives there and vanishes with it), resource limits (address space, CPU seconds,
processes, file size, open files, no core dumps), an empty environment but PATH, and a throwaway
uid with no groups, so it can neither write the machine's files, read other processes' secrets nor
signal its parent. On timeout every process of that uid is SIGKILLed, fork bombs included.

Without root, it falls back to what an unprivileged process can do: rlimits, a fresh temp dir,
sockets disabled inside Python, a new session killed as a group. That is weaker; say so in logs.
"""

from __future__ import annotations

import ctypes
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_REC, MS_PRIVATE = 16384, 1 << 18
UID_RANGE = (200_000, 260_000)  # throwaway uids: no passwd entry, no files, nothing to signal

# Runs first in the child: read the program from stdin, block sockets when namespaces were not
# available, then execute it as __main__.
BOOTSTRAP = """
import sys, os
src = sys.stdin.read()
if os.environ.get("SANDBOX_BLOCK_SOCKETS") == "1":
    import socket
    def _refuse(*a, **k):
        raise PermissionError("network disabled in sandbox")
    socket.socket = _refuse; socket.create_connection = _refuse; socket.socketpair = _refuse
del os.environ["SANDBOX_BLOCK_SOCKETS"]
exec(compile(src, "<sandbox>", "exec"), {"__name__": "__main__"})
"""


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    isolated: bool  # namespaces + uid (True) or the unprivileged fallback (False)


def _libc():
    return ctypes.CDLL("libc.so.6", use_errno=True)


def _limits(memory_mb: int, cpu_s: int, max_procs: int) -> None:
    mem = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (max_procs, max_procs))


def _isolate(uid: int, memory_mb: int, cpu_s: int, max_procs: int) -> None:
    """preexec_fn as root: namespaces, private tmpfs, limits, then drop to `uid`."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        os._exit(121)
    libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
    for d in (b"/tmp", b"/var/tmp", b"/dev/shm"):
        if os.path.isdir(d) and libc.mount(b"tmpfs", d, b"tmpfs", 0, b"size=64m,mode=1777") != 0:
            os._exit(122)
    os.makedirs("/tmp/work", exist_ok=True)
    os.chown("/tmp/work", uid, uid)
    os.chdir("/tmp/work")
    _limits(memory_mb, cpu_s, max_procs)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _kill_uid(uid: int) -> None:
    for _ in range(3):  # a fork bomb may spawn between passes
        found = False
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if p.stat().st_uid == uid:
                        os.kill(int(p.name), signal.SIGKILL)
                        found = True
                except (OSError, ProcessLookupError):
                    pass
        if not found:
            return
        time.sleep(0.05)


def sandbox_python() -> str:
    """An interpreter the throwaway uid may execute: ours often lives under a private home."""
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"):
        path = Path(candidate)
        if path.exists() and all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents]):
            return candidate
    return ""


def namespaces_available() -> bool:
    return os.geteuid() == 0 and sys.platform.startswith("linux") and bool(sandbox_python())


def run_python(code: str, timeout_s: float = 10.0, memory_mb: int = 1024, cpu_s: int | None = None,
               max_procs: int = 32) -> SandboxResult:
    cpu_s = cpu_s or max(1, int(timeout_s) + 1)
    isolated = namespaces_available()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "SANDBOX_BLOCK_SOCKETS": "0" if isolated else "1"}
    workdir = None
    if isolated:
        uid = random.randint(*UID_RANGE)
        preexec = lambda: _isolate(uid, memory_mb, cpu_s, max_procs)  # noqa: E731
        cwd = "/"
    else:
        uid = None
        workdir = tempfile.mkdtemp(prefix="sandbox-")
        preexec = lambda: _limits(memory_mb, cpu_s, max_procs + 256)  # noqa: E731
        cwd = workdir
    python = sandbox_python() if isolated else sys.executable
    proc = subprocess.Popen([python, "-I", "-S", "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env={**env, "HOME": "/tmp/work" if isolated else cwd},
                            start_new_session=True, preexec_fn=preexec)
    timed_out = False
    try:
        out, err = proc.communicate(code.encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        out, err = b"", b""
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if uid is not None:
            _kill_uid(uid)
        if timed_out:
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        proc.wait()
        if workdir:
            import shutil
            shutil.rmtree(workdir, ignore_errors=True)
    return SandboxResult(None if timed_out else proc.returncode, out.decode(errors="replace")[-20000:],
                         err.decode(errors="replace")[-20000:], timed_out, isolated)
