"""Run untrusted Python (model-written code) in bubblewrap, or refuse.

The engine is bubblewrap (`bwrap`, Debian/Ubuntu package `bubblewrap`, the sandbox Flatpak uses).
Every run gets:
- all namespaces of its own: user, pid, net (a down loopback only), ipc, uts, mount (cgroup where
  the kernel has it); `--die-with-parent`, `--new-session`, every capability dropped, and inside it
  runs as uid/gid 65534; bwrap sets no_new_privs;
- a filesystem of read-only binds of /usr (the interpreter and its standard library, with the
  /bin, /lib, /lib64 links), a fresh /proc, a minimal /dev, and fresh size-limited tmpfs mounts at
  /tmp and /work (the working directory). Nothing else of the host is there: not the repository,
  not the virtualenv, not $POSTTRAIN_HOME (eval golds, the MLflow store), not any home directory;
- rlimits (address space, CPU seconds, processes, file size, open files, no core files) and a wall
  timeout, after which the whole process tree is SIGKILLed;
- when started as root, bwrap itself runs as a throwaway uid with no groups, so even an escape from
  the namespaces lands as nobody, and RLIMIT_NPROC (which root ignores) stops fork bombs.

The interpreter is the system's (`/usr/bin/python3`, or $POSTTRAIN_SANDBOX_PYTHON), not the
virtualenv's, which usually lives under a home directory that must stay invisible.

There is no silent fallback. When bwrap cannot run, `sandbox_problem()` says why, rewards that
execute code refuse to build, and recipes that use them are refused at validation. Running
unsandboxed needs `allow_unsandboxed: true` on the reward; it is logged as a warning, tagged on the
stage's MLflow run, and even then the code never runs as root (it drops to a throwaway uid).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SANDBOX_TAG = "posttrain.sandbox"  # MLflow tag on a stage whose rewards ran code: "bwrap" or "unsandboxed"
UID_RANGE = (200_000, 260_000)  # throwaway uids: no passwd entry, no files, nothing to signal
INNER_UID = 65534  # "nobody" inside the user namespace
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; `make setup` does it when run "
                "as root), or set allow_unsandboxed: true on the reward to run model code without a sandbox")


class SandboxUnavailable(RuntimeError):
    """bwrap cannot run here and the caller did not opt into running unsandboxed."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0
    memory_mb: int = 1024
    cpu_s: int | None = None  # default: the wall timeout rounded up, plus one
    max_procs: int = 32
    tmpfs_mb: int = 64
    max_output_bytes: int = 1 << 20


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    engine: str  # "bwrap" or "unsandboxed"


def sandbox_python() -> str:
    return os.environ.get("POSTTRAIN_SANDBOX_PYTHON") or "/usr/bin/python3"


def bwrap_command(python: str, tmpfs_mb: int) -> list[str]:
    size = str(tmpfs_mb << 20)
    cmd = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
           "--cap-drop", "ALL", "--uid", str(INNER_UID), "--gid", str(INNER_UID), "--hostname", "sandbox",
           "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "sbin"):  # merged-/usr links, where the host has them
        target = Path("/") / name
        if target.is_symlink():
            cmd += ["--symlink", os.readlink(target), f"/{name}"]
        elif target.is_dir():
            cmd += ["--ro-bind", str(target), f"/{name}"]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/tmp",
            "--size", size, "--tmpfs", "/work", "--chdir", "/work", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", "/work",
            "--", python]
    return cmd


def _processes_of(uid: int) -> int:
    n = 0
    for p in Path("/proc").iterdir():
        try:
            n += p.name.isdigit() and p.stat().st_uid == uid
        except OSError:
            pass
    return n


def _limits(limits: Limits, nproc: int) -> None:
    mem = limits.memory_mb << 20
    cpu = limits.cpu_s or int(limits.timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _drop_to(uid: int | None) -> None:
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of a throwaway uid (a fork bomb may spawn between passes)."""
    for _ in range(5):
        found = False
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if p.stat().st_uid == uid:
                        os.kill(int(p.name), signal.SIGKILL)
                        found = True
                except OSError:
                    pass
        if not found:
            return
        time.sleep(0.05)


def _spawn(argv: list[str], stdin: bytes, limits: Limits, uid: int | None, cwd: str,
           env: dict[str, str]) -> tuple[int | None, bytes, bytes, bool]:
    # RLIMIT_NPROC counts every process of the real uid: a throwaway uid starts at zero; an ordinary
    # user (no root) keeps what it already runs plus the sandbox's allowance.
    nproc = limits.max_procs + (0 if uid is not None else _processes_of(os.getuid()))
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                            env=env, start_new_session=True,
                            preexec_fn=lambda: (_limits(limits, nproc), _drop_to(uid)))
    timed_out = False
    try:
        out, err = proc.communicate(stdin, timeout=limits.timeout_s)
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
    cap = limits.max_output_bytes
    return (None if timed_out else proc.returncode), out[-cap:], err[-cap:], timed_out


def _throwaway_uid() -> int | None:
    return random.randint(*UID_RANGE) if os.geteuid() == 0 else None


@functools.cache
def sandbox_problem() -> str | None:
    """None when bwrap runs here with every namespace; else why not (probed once per process)."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (this is {sys.platform}); {INSTALL_HINT}"
    if shutil.which("bwrap") is None:
        return f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}"
    python = sandbox_python()
    if not os.access(python, os.X_OK):
        return f"no interpreter at {python} for the sandbox (set POSTTRAIN_SANDBOX_PYTHON); {INSTALL_HINT}"
    try:
        code, out, err, timed_out = _spawn(bwrap_command(python, 8) + ["-I", "-S", "-c", "print('ok')"], b"",
                                           Limits(timeout_s=20), _throwaway_uid(), "/", {"PATH": "/usr/bin:/bin"})
    except OSError as e:
        return f"bwrap could not start: {e}; {INSTALL_HINT}"
    if code != 0 or out.strip() != b"ok":
        why = "timed out" if timed_out else err.decode(errors="replace").strip()[-300:]
        return f"bwrap cannot create its namespaces here ({why}); {INSTALL_HINT}"
    return None


def require_sandbox(allow_unsandboxed: bool = False) -> str:
    """The engine code will run under: "bwrap", or "unsandboxed" when allowed and bwrap is missing."""
    problem = sandbox_problem()
    if problem is None:
        return "bwrap"
    if not allow_unsandboxed:
        raise SandboxUnavailable(f"code execution needs the sandbox: {problem}")
    log.warning("running model-written code WITHOUT a sandbox (allow_unsandboxed: true): %s", problem)
    return "unsandboxed"


def run_python(code: str, stdin: bytes = b"", limits: Limits | None = None, allow_unsandboxed: bool = False,
               **limit_fields) -> SandboxResult:
    """Run `python -I -S -c code` contained, feeding it `stdin`. Raises SandboxUnavailable when bwrap
    cannot run and `allow_unsandboxed` is False."""
    limits = limits or Limits(**limit_fields)
    engine = require_sandbox(allow_unsandboxed)
    uid = _throwaway_uid()
    if engine == "bwrap":
        argv = bwrap_command(sandbox_python(), limits.tmpfs_mb) + ["-I", "-S", "-c", code]
        rc, out, err, timed_out = _spawn(argv, stdin, limits, uid, "/", {"PATH": "/usr/bin:/bin"})
    else:
        workdir = tempfile.mkdtemp(prefix="posttrain-unsandboxed-")
        if uid is not None:
            os.chown(workdir, uid, uid)
        try:
            rc, out, err, timed_out = _spawn([sandbox_python(), "-I", "-S", "-c", code], stdin, limits, uid,
                                             workdir, {"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"})
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return SandboxResult(rc, out.decode(errors="replace"), err.decode(errors="replace"), timed_out, engine)
