"""Process lifetime: children that the kernel kills when their parent dies, so nothing a run starts
outlives it; and a free loopback port for what they serve. Kept apart from the worker so light
processes (`posttrain ui`, the Prefect API helper) can use it without importing the stage kinds."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a Popen preexec_fn, or called by a
    worker at start), so no rank or server outlives its launcher."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    """A free TCP port on loopback (for a server or DeepSpeed's rendezvous) at the time of asking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a process started with start_new_session and everything in its group: SIGTERM, then
    SIGKILL after `grace_s`. A no-op once it has exited."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
