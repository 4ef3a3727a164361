"""Run untrusted Python (model-written code) in bubblewrap, or refuse.

The engine is bubblewrap (`bwrap`, Debian/Ubuntu package `bubblewrap`, the sandbox Flatpak uses).
Every run gets:
- all namespaces of its own: user, pid, net (a down loopback only), ipc, uts, mount (cgroup where
  the kernel has it); `--die-with-parent`, `--new-session`, every capability dropped, and inside it
  runs as uid/gid 65534; bwrap sets no_new_privs;
- `--as-pid-1`: the program we start IS the sandbox's pid 1. There is no bwrap reaper inside holding
  our pipes, processes inside cannot signal pid 1 with anything it has not chosen to handle
  (SIGKILL and SIGSTOP included: the kernel protects a namespace's init), and when pid 1 exits the
  kernel kills every other process in the sandbox, so no detached grandchild outlives it;
- a seccomp filter (bwrap `--seccomp`) that fails ptrace, process_vm_readv/writev, pidfd_open,
  pidfd_getfd and kcmp with EPERM, and kills a process that enters the kernel through another ABI
  (x32, i386) where those numbers differ. No process in the sandbox can read another's memory or
  take its file descriptors, even at the same uid;
- a filesystem of read-only binds of /usr (the interpreter and its standard library, with the
  /bin, /lib, /lib64 links), a fresh /proc, a minimal read-only /dev, a read-only root, and ONE
  size-limited tmpfs at /work (the working directory; /tmp links to it): `tmpfs_mb` is all the
  disk the sandbox has, together. Nothing else of the host is there: not the repository, not the
  virtualenv, not $POSTTRAIN_HOME (eval golds, the MLflow store), not any home directory;
- limits that hold for the sandbox as a whole: at most `max_procs` processes (RLIMIT_NPROC, on the
  throwaway uid from outside and set again by the harness inside, threads included), each with an
  address space of `memory_mb / max_procs` (RLIMIT_AS), so together they never exceed `memory_mb`;
  CPU seconds, file size, open files, no core files; a wall timeout, after which the whole process
  tree is SIGKILLed; and at most `max_output_bytes` of stdout and stderr together, read with a
  bounded reader (a sandbox that writes more is killed and flagged, never buffered);
- when started as root, bwrap itself runs as a throwaway uid with no groups, so even an escape from
  the namespaces lands as nobody, and RLIMIT_NPROC (which root ignores) stops fork bombs.

`run_python(..., channel=True)` gives the program a private pipe for its result, passed as the fd
number in `sys.argv[1]`; stdout and stderr are diagnostics only. toolkit/rewards/code.py explains how
its harness keeps that pipe out of model code's reach.

The interpreter is the system's (`/usr/bin/python3`, or $POSTTRAIN_SANDBOX_PYTHON), not the
virtualenv's, which usually lives under a home directory that must stay invisible.

There is no silent fallback. When bwrap cannot run (or this architecture has no seccomp table),
`sandbox_problem()` says why, rewards that execute code refuse to build, and recipes that use them
are refused at validation. Running unsandboxed needs `allow_unsandboxed: true` on the reward; it is
logged as a warning, tagged on the stage's MLflow run, and even then the code never runs as root
(it drops to a throwaway uid).
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import random
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

SANDBOX_TAG = "posttrain.sandbox"  # MLflow tag on a stage whose rewards ran code: "bwrap" or "unsandboxed"
UID_RANGE = (200_000, 260_000)  # throwaway uids: no passwd entry, no files, nothing to signal
INNER_UID = 65534  # "nobody" inside the user namespace
MAX_CHANNEL_BYTES = 64 << 10  # a result is a line of JSON; more is not a result
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; `make setup` does it when run "
                "as root), or set allow_unsandboxed: true on the reward to run model code without a sandbox")

# Syscalls that let one process reach into another's memory or file descriptors, by architecture:
# (AUDIT_ARCH, {name: number}). ptrace and process_vm_* read memory; pidfd_getfd copies a file
# descriptor out of another process; pidfd_open is its first step; kcmp compares fds across processes.
DENIED_SYSCALLS = {
    "x86_64": (0xC000003E, {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
                            "pidfd_open": 434, "pidfd_getfd": 438}),
    "aarch64": (0xC00000B7, {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
                             "pidfd_open": 434, "pidfd_getfd": 438}),
}
X32_SYSCALL_BIT = 0x40000000


class SandboxUnavailable(RuntimeError):
    """bwrap cannot run here and the caller did not opt into running unsandboxed."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0
    memory_mb: int = 1024  # the whole sandbox: max_procs processes of memory_mb / max_procs each
    cpu_s: int | None = None  # default: the wall timeout rounded up, plus one
    max_procs: int = 4  # every process and thread in the sandbox, the harness included
    tmpfs_mb: int = 64  # all writable space in the sandbox, together
    max_output_bytes: int = 1 << 20  # stdout and stderr together

    @property
    def process_bytes(self) -> int:
        return (self.memory_mb << 20) // self.max_procs


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    engine: str  # "bwrap" or "unsandboxed"
    channel: bytes | None = None  # what the program wrote on its result pipe (run_python(channel=True))
    output_overflow: bool = False  # it wrote more than the limits allow (killed when it did)


@dataclass
class _Spawned:
    returncode: int | None = None
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    channel: bytearray = field(default_factory=bytearray)
    timed_out: bool = False
    overflow: bool = False


def sandbox_python() -> str:
    return os.environ.get("POSTTRAIN_SANDBOX_PYTHON") or "/usr/bin/python3"


def seccomp_program(machine: str | None = None) -> bytes:
    """The classic-BPF seccomp filter bwrap installs (`--seccomp FD`): EPERM for DENIED_SYSCALLS,
    kill for any other ABI, allow the rest. Raises KeyError for an architecture without a table."""
    arch, numbers = DENIED_SYSCALLS[machine or platform.machine()]
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny, kill = 0x7FFF0000, 0x00050000 | 1, 0x80000000  # SECCOMP_RET_ALLOW, _ERRNO|EPERM, _KILL_PROCESS
    nrs = sorted(numbers.values())
    insns = [(ld_abs, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld_abs, 0, 0, 0)]
    if arch == DENIED_SYSCALLS["x86_64"][0]:
        insns.append((jge, len(nrs) + 1, 0, X32_SYSCALL_BIT))  # x32 calls: to the deny below
    for i, nr in enumerate(nrs):
        insns.append((jeq, len(nrs) - i, 0, nr))  # jump to the deny after the allow
    insns += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("=HBBI", *insn) for insn in insns)


def bwrap_command(python: str, tmpfs_mb: int, seccomp_fd: int) -> list[str]:
    cmd = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1",
           "--cap-drop", "ALL", "--uid", str(INNER_UID), "--gid", str(INNER_UID), "--hostname", "sandbox",
           "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "sbin"):  # merged-/usr links, where the host has them
        target = Path("/") / name
        if target.is_symlink():
            cmd += ["--symlink", os.readlink(target), f"/{name}"]
        elif target.is_dir():
            cmd += ["--ro-bind", str(target), f"/{name}"]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",  # /dev/shm too: no disk outside /work
            "--size", str(tmpfs_mb << 20), "--tmpfs", "/work", "--symlink", "/work", "/tmp", "--remount-ro", "/",
            "--chdir", "/work", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "HOME", "/work", "--setenv", "TMPDIR", "/work", "--seccomp", str(seccomp_fd), "--", python]
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
    mem = limits.process_bytes
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


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass  # it stopped reading: its business
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _collect(proc: subprocess.Popen, channel_fd: int | None, limits: Limits, got: _Spawned) -> None:
    """Read stdout, stderr and the result pipe until they close or a limit is hit, never holding
    more than the limits allow: stdout+stderr past max_output_bytes, or a result past
    MAX_CHANNEL_BYTES, ends the run (`overflow`)."""
    deadline = time.monotonic() + limits.timeout_s
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, got.out)
    sel.register(proc.stderr, selectors.EVENT_READ, got.err)
    if channel_fd is not None:
        sel.register(channel_fd, selectors.EVENT_READ, got.channel)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                got.timed_out = True
                return
            for key, _ in sel.select(timeout=left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if len(got.out) + len(got.err) > limits.max_output_bytes or len(got.channel) > MAX_CHANNEL_BYTES:
                    got.overflow = True
                    return
        try:
            got.returncode = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            got.timed_out = True
    finally:
        sel.close()


def _spawn(argv: list[str], stdin: bytes, limits: Limits, uid: int | None, cwd: str, env: dict[str, str],
           channel: bool = False, pass_fds: tuple[int, ...] = ()) -> _Spawned:
    # RLIMIT_NPROC counts every process of the real uid: a throwaway uid starts at zero (bwrap's own
    # process outside the sandbox is one); an ordinary user keeps what it already runs, and the
    # harness sets the sandbox's own allowance again inside its user namespace.
    nproc = limits.max_procs + (1 if uid is not None else _processes_of(os.getuid()))
    read_end = write_end = None
    if channel:
        read_end, write_end = os.pipe()
        argv = [*argv, str(write_end)]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=cwd, env=env, start_new_session=True,
                                pass_fds=pass_fds + ((write_end,) if channel else ()),
                                preexec_fn=lambda: (_limits(limits, nproc), _drop_to(uid)))
    finally:
        if write_end is not None:
            os.close(write_end)  # the sandbox holds the only write end now
    got = _Spawned()
    feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)
    feeder.start()
    try:
        _collect(proc, read_end, limits, got)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if uid is not None:
            _kill_uid(uid)
        proc.wait()
        for f in (proc.stdout, proc.stderr):
            f.close()
        if read_end is not None:
            os.close(read_end)
        feeder.join(timeout=1)
    if got.timed_out or got.overflow:
        got.returncode = None
    return got


def _throwaway_uid() -> int | None:
    return random.randint(*UID_RANGE) if os.geteuid() == 0 else None


def _run_in_bwrap(code_argv: list[str], stdin: bytes, limits: Limits, channel: bool) -> _Spawned:
    read_end, write_end = os.pipe()  # the seccomp program, read once by bwrap
    try:
        os.write(write_end, seccomp_program())
        os.close(write_end)
        argv = bwrap_command(sandbox_python(), limits.tmpfs_mb, read_end) + code_argv
        return _spawn(argv, stdin, limits, _throwaway_uid(), "/", {"PATH": "/usr/bin:/bin"}, channel, (read_end,))
    finally:
        os.close(read_end)


@functools.cache
def sandbox_problem() -> str | None:
    """None when bwrap runs here with every namespace and the seccomp filter; else why not (probed
    once per process)."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (this is {sys.platform}); {INSTALL_HINT}"
    if platform.machine() not in DENIED_SYSCALLS:
        return (f"the sandbox's seccomp filter has no syscall table for {platform.machine()} (known: "
                f"{', '.join(DENIED_SYSCALLS)}); {INSTALL_HINT}")
    if shutil.which("bwrap") is None:
        return f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}"
    python = sandbox_python()
    if not os.access(python, os.X_OK):
        return f"no interpreter at {python} for the sandbox (set POSTTRAIN_SANDBOX_PYTHON); {INSTALL_HINT}"
    try:
        got = _run_in_bwrap(["-I", "-S", "-c", "print('ok')"], b"", Limits(timeout_s=20, memory_mb=256), False)
    except OSError as e:
        return f"bwrap could not start: {e}; {INSTALL_HINT}"
    if got.returncode != 0 or got.out.strip() != b"ok":
        why = "timed out" if got.timed_out else got.err.decode(errors="replace").strip()[-300:]
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
               channel: bool = False, **limit_fields) -> SandboxResult:
    """Run `python -I -S -c code` contained, feeding it `stdin`; with `channel`, the program gets a
    private result pipe (its fd number in sys.argv[1]) whose contents come back as `.channel`.
    Raises SandboxUnavailable when bwrap cannot run and `allow_unsandboxed` is False."""
    limits = limits or Limits(**limit_fields)
    engine = require_sandbox(allow_unsandboxed)
    if engine == "bwrap":
        got = _run_in_bwrap(["-I", "-S", "-c", code], stdin, limits, channel)
    else:
        uid = _throwaway_uid()
        workdir = tempfile.mkdtemp(prefix="posttrain-unsandboxed-")
        if uid is not None:
            os.chown(workdir, uid, uid)
        try:
            got = _spawn([sandbox_python(), "-I", "-S", "-c", code], stdin, limits, uid, workdir,
                         {"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"}, channel)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return SandboxResult(got.returncode, got.out.decode(errors="replace"), got.err.decode(errors="replace"),
                         got.timed_out, engine, bytes(got.channel) if channel else None, got.overflow)
